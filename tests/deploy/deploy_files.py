"""The deploy files, read the way their own tools read them, for the tests of tests/deploy.

compose.yaml is interpolated as Compose interpolates it and its mounts parsed in short or
long form; the Kubernetes base is loaded in kustomization.yaml's order, with the environment
its ConfigMaps and the downward API give a container; Dockerfiles are split into stages; and
every command is parsed by the real ``weir`` parser into the settings ``weir`` would build.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from weir import cli
from weir.settings import BatcherSettings, GatewaySettings, WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
K8S = ROOT / "deploy" / "k8s"
DOCKER = ROOT / "deploy" / "docker"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DEPLOY_DOCS = (ROOT / "deploy" / "README.md", ROOT / "README.md")
EXAMPLES = ROOT / "examples" / "models"

WEIR_SERVICES = ("gateway", "batcher", "worker-cpu", "worker-gpu")
SETTINGS_BY_COMMAND: dict[str, type[BaseSettings]] = {
    "gateway": GatewaySettings,
    "batcher": BatcherSettings,
    "worker": WorkerSettings,
}
HEALTH_PATHS = {"readinessProbe": "/v2/health/ready", "livenessProbe": "/v2/health/live"}
METRICS_PORT = 8002
GRPC_PORT = 8001  # Triton's
# Pod names a Deployment's pods get; what the downward API's metadata.name gives a container.
POD_NAME = "{workload}-5d9c7b6f4-x7k2p"


# --- compose.yaml -----------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$(?:\$|\{(?P<name>\w+)(?:(?P<op>:?-)(?P<default>[^}]*))?\})")


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}`` and ``$$``, recursively."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        current = env.get(match["name"])
        if match["op"] == ":-" and not current:
            return match["default"]
        if match["op"] == "-" and current is None:
            return match["default"]
        return current or ""

    return _VARIABLE.sub(substitute, value)


def load_compose(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """compose.yaml as ``docker compose config`` sees it, with ``env`` (default: none set)."""
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    return interpolate(raw, env or {})


def compose_services() -> dict[str, dict[str, Any]]:
    return load_compose()["services"]


@dataclass(frozen=True)
class Mount:
    """One entry of a service's ``volumes``, short (``source:target[:ro]``) or long form."""

    source: str
    target: str
    read_only: bool
    named: bool  # a volume of the top-level ``volumes`` rather than a host path


def compose_mounts(compose: dict[str, Any], service: str) -> list[Mount]:
    """A service's ``volumes``, each named volume checked against the top-level ones."""
    mounts = [_mount(entry) for entry in compose["services"][service].get("volumes", [])]
    for mount in mounts:
        if mount.named:
            assert mount.source in compose.get("volumes", {}), f"{service}: {mount.source}?"
    return mounts


def compose_mount(compose: dict[str, Any], service: str, target: str) -> Mount:
    """The one mount of ``service`` at ``target``."""
    found = [m for m in compose_mounts(compose, service) if m.target == target]
    assert len(found) == 1, f"{service} has {len(found)} mounts at {target!r}"
    return found[0]


def _mount(entry: str | dict[str, Any]) -> Mount:
    if isinstance(entry, dict):
        source = str(entry.get("source", ""))
        named = entry["type"] == "volume" and bool(source)
        return Mount(source, entry["target"], bool(entry.get("read_only")), named)
    parts = entry.split(":")
    if len(parts) == 1:  # an anonymous volume: the target alone
        parts = ["", *parts]
    source, target, mode = [*parts, ""][:3]
    named = bool(source) and not source.startswith((".", "/", "~"))
    return Mount(source, target, "ro" in mode.split(","), named)


def duration_s(text: str) -> float:
    """A compose duration such as ``30s``, ``1m30s`` or ``1500ms``, in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


# --- Kubernetes -------------------------------------------------------------------------------


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def k8s_documents() -> list[dict[str, Any]]:
    """Every object of the base, in the order kustomization.yaml lists its files."""
    documents = []
    for resource in kustomization()["resources"]:
        documents += [d for d in yaml.safe_load_all((K8S / resource).read_text()) if d]
    return documents


def k8s_objects(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in k8s_documents() if d["kind"] == kind}


def containers(kind: str = "Deployment") -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(workload name, pod spec, container) for each container of each workload of ``kind``."""
    for name, workload in k8s_objects(kind).items():
        pod = workload["spec"]["template"]["spec"]
        for container in pod["containers"]:
            yield name, pod, container


def resolved_image(image: str) -> str:
    """An image as kustomize's ``images`` transformer leaves it."""
    name, _, tag = image.partition(":")
    for rule in kustomization().get("images", []):
        if rule["name"] == name:
            return f"{rule.get('newName', name)}:{rule.get('newTag', tag)}"
    return image


def configmap_env() -> dict[str, str]:
    """Every setting the ConfigMaps hold."""
    return {k: v for cm in k8s_objects("ConfigMap").values() for k, v in cm["data"].items()}


def container_env(container: dict[str, Any], workload: str = "pod") -> dict[str, str]:
    """The environment a container of ``workload`` gets from its ConfigMaps and ``env``."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(k8s_objects("ConfigMap")[source["configMapRef"]["name"]]["data"])
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            env[variable["name"]] = _downward_value(container, workload, variable["valueFrom"])
    return env


def _downward_value(container: dict[str, Any], workload: str, source: dict[str, Any]) -> str:
    """What the downward API gives: a resource (rounded up, as Kubernetes does), the pod name."""
    if "fieldRef" in source:
        assert source["fieldRef"]["fieldPath"] == "metadata.name", source
        return POD_NAME.format(workload=workload)
    ref = source["resourceFieldRef"]
    assert ref["containerName"] == container["name"], ref
    assert str(ref["divisor"]) == "1", ref
    section, _, resource = ref["resource"].partition(".")
    return str(math.ceil(cpu_cores(container["resources"][section][resource])))


def cpu_cores(quantity: str | int | float) -> float:
    """A CPU quantity (``2``, ``"500m"``) in cores."""
    text = str(quantity)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def weir_argv(container: dict[str, Any]) -> list[str]:
    """What the container runs: command (or the image's entrypoint) plus args."""
    return [*container.get("command", []), *container.get("args", [])]


# --- weir commands and settings ---------------------------------------------------------------


def parse_weir(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` with the real ``weir`` parser; fail the test on any error."""
    assert argv[:1] == ["weir"], f"not a weir command: {argv}"
    try:
        return cli._parser().parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"weir rejects {argv}")


def setting_env_names(cls: type[BaseSettings]) -> set[str]:
    """The environment variables a settings class reads."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    found = set()
    for field, info in cls.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            found |= {str(c).upper() for c in alias.choices if str(c).upper().startswith("WEIR_")}
        else:
            found.add(f"{prefix}{field}".upper())
    return found


def settings_from(
    argv: list[str], env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch
) -> BaseSettings:
    """The settings ``weir`` builds for ``argv`` under exactly ``env`` (as cli.main does)."""
    for key in [k for k in os.environ if k.startswith("WEIR_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = parse_weir(argv)
    unknown = {k for k in env if k.startswith("WEIR_")} - setting_env_names(
        SETTINGS_BY_COMMAND[args.command]
    )
    assert not unknown, f"{argv}: not settings of `weir {args.command}`: {sorted(unknown)}"
    return SETTINGS_BY_COMMAND[args.command](**cli._overrides(args))


def drain_s(settings: BaseSettings) -> float:
    """The longest a service takes to exit after SIGTERM: one read block, 1 s, the grace."""
    block_s = getattr(settings, "block_ms", 0) / 1000
    return block_s + 1 + float(settings.shutdown_grace_s)


# --- Redis ------------------------------------------------------------------------------------


def redis_options(argv: list[str]) -> dict[str, str]:
    """``redis-server --name value ...`` as {name: value}."""
    assert argv[0] == "redis-server" and len(argv) % 2 == 1, argv
    flags, values = argv[1::2], argv[2::2]
    assert all(flag.startswith("--") for flag in flags), argv
    return {flag[2:]: value for flag, value in zip(flags, values, strict=True)}


def redis_major(image: str) -> int:
    name, _, tag = image.partition(":")
    assert name == "redis" and tag[:1].isdigit(), f"pin a Redis version: {image}"
    return int(tag.split(".")[0])


# --- Dockerfiles ------------------------------------------------------------------------------


def dockerfile_args(text: str) -> dict[str, str]:
    """Each ``ARG NAME=default`` (the default may be empty); the last one of a name wins."""
    return dict(re.findall(r"^ARG (\w+)=(\S*)$", text, flags=re.MULTILINE))


@dataclass(frozen=True)
class Stage:
    """One ``FROM`` of a Dockerfile and its instructions, continuation lines joined."""

    name: str  # "" for an unnamed stage
    base: str
    lines: tuple[str, ...]

    def declares(self) -> set[str]:
        return {line.split()[1].split("=")[0] for line in self.lines if line.startswith("ARG ")}

    def runs(self) -> list[str]:
        return [line for line in self.lines if line.startswith("RUN ")]


def dockerfile_stages(text: str) -> list[Stage]:
    """A Dockerfile's stages, after a first with no base: the global ARGs, for FROM lines."""
    lines = [line.strip() for line in re.sub(r"\\\n", " ", text).splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    starts = [i for i, line in enumerate(lines) if line.startswith("FROM ")]
    stages = [Stage("", "", tuple(lines[: starts[0]]))]  # the global ARGs, for FROM lines
    for start, end in zip(starts, [*starts[1:], len(lines)], strict=True):
        match = re.fullmatch(r"FROM (\S+)(?: AS (\w+))?", lines[start])
        assert match is not None, lines[start]
        stages.append(Stage(match[2] or "", match[1], tuple(lines[start + 1 : end])))
    return stages
