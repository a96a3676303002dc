"""The deploy files hold together: compose.yaml, the Dockerfiles and the Kubernetes base.

No Docker engine or cluster runs here, so these tests check what can be checked without
one: compose.yaml against the Compose Specification's own schema (shipped by
check-jsonschema), Kubernetes objects against the Kubernetes OpenAPI schemas (shipped by
kubernetes-validate), and the rest against Weir itself: every command is a real ``weir``
invocation, every environment variable a real setting, probes hit real routes on the port
the gateway binds, grace periods cover the drain, images and ports agree everywhere, only
the gateway serves (and Prometheus scrapes) metrics, every ``WEIR_*`` name the deploy files
and their docs mention is a real setting, and KEDA scales each worker pool on the batch
streams of exactly the models it serves.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

import weir
from weir import cli, names
from weir.config import load_config
from weir.settings import (
    BatcherSettings,
    GatewaySettings,
    ServiceSettings,
    UpSettings,
    WorkerSettings,
)

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
# The oldest Kubernetes whose schemas kubernetes-validate ships; the base must apply there.
KUBERNETES_VERSION = "1.29.0"
CUSTOM_KINDS = {("keda.sh/v1alpha1", "ScaledObject")}


# --- loading ----------------------------------------------------------------------------------

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


def duration_s(text: str) -> float:
    """A compose duration such as ``30s``, ``1m30s`` or ``1500ms``, in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


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


# --- compose.yaml -----------------------------------------------------------------------------


def test_compose_file_validates_against_the_compose_specification_schema() -> None:
    schema_text = (
        files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text()
    )
    validator = jsonschema.Draft202012Validator(json.loads(schema_text))
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(load_compose())
    ]
    assert not errors, "\n".join(errors)


def test_compose_runs_the_mesh_with_gpu_and_observability_behind_profiles() -> None:
    services = compose_services()
    assert set(services) == {"redis", *WEIR_SERVICES, "prometheus"}
    profiles = {name: service.get("profiles", []) for name, service in services.items()}
    assert profiles == {
        "redis": [],
        "gateway": [],
        "batcher": [],
        "worker-cpu": [],
        "worker-gpu": ["gpu"],
        "prometheus": ["observability"],
    }
    for name in WEIR_SERVICES:
        assert services[name]["depends_on"] == {"redis": {"condition": "service_healthy"}}


def test_compose_commands_and_environment_build_valid_settings_for_each_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in WEIR_SERVICES:
        service = compose_services()[name]
        settings = settings_from(service["command"], service["environment"], monkeypatch)
        mount = next(v for v in service["volumes"] if v["target"] == str(settings.repository))
        assert mount["read_only"] is True, f"{name}: the model repository must be read-only"
        assert (ROOT / mount["source"]).is_dir(), f"{name}: no repository at {mount['source']}"
        assert urlsplit(settings.redis_url).hostname == "redis"
        if isinstance(settings, WorkerSettings):
            assert name == f"worker-{settings.pool}"


def test_scalable_compose_services_have_no_container_name_or_host_port() -> None:
    for name, service in compose_services().items():
        assert "container_name" not in service, name
        if name in ("batcher", "worker-cpu", "worker-gpu"):
            assert "ports" not in service, f"{name} publishes a host port: --scale would clash"


def test_compose_gateway_publishes_http_and_grpc_and_its_healthcheck_asks_readiness() -> None:
    gateway = compose_services()["gateway"]
    http_port = gateway["environment"]["WEIR_GATEWAY_HTTP_PORT"]
    grpc_port = gateway["environment"]["WEIR_GATEWAY_GRPC_PORT"]
    assert grpc_port == str(GRPC_PORT)
    assert [p.rpartition(":")[2] for p in gateway["ports"]] == [http_port, grpc_port]
    # Metrics stay inside the compose network: exposed to Prometheus, published nowhere.
    assert gateway["environment"]["WEIR_GATEWAY_METRICS_PORT"] == str(METRICS_PORT)
    assert gateway["expose"] == [str(METRICS_PORT)]
    test = gateway["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"] and "/v2/health/ready" in test[3]
    assert duration_s(gateway["healthcheck"]["start_period"]) >= 30


def test_compose_redis_is_version_7_with_aof_and_a_ping_healthcheck() -> None:
    redis = compose_services()["redis"]
    assert redis_major(redis["image"]) >= 7
    assert redis["command"][:3] == ["redis-server", "--appendonly", "yes"]
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def redis_major(image: str) -> int:
    name, _, tag = image.partition(":")
    assert name == "redis" and tag[:1].isdigit(), f"pin a Redis version: {image}"
    return int(tag.split(".")[0])


def test_compose_gpu_worker_reserves_an_nvidia_gpu_and_runs_the_cuda_image() -> None:
    worker = compose_services()["worker-gpu"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert worker["build"]["dockerfile"] == "deploy/docker/Dockerfile.cuda"
    assert worker["image"].split(":")[0] == "weir-cuda"


def test_compose_stop_grace_period_outlasts_each_services_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in WEIR_SERVICES:
        service = compose_services()[name]
        settings = settings_from(service["command"], service["environment"], monkeypatch)
        assert duration_s(service["stop_grace_period"]) > drain_s(settings), name


def drain_s(settings: BaseSettings) -> float:
    """The longest a service takes to exit after SIGTERM: one read block, 1 s, the grace."""
    block_s = getattr(settings, "block_ms", 0) / 1000
    return block_s + 1 + float(settings.shutdown_grace_s)


def test_compose_images_are_this_version_built_from_the_repository_dockerfiles() -> None:
    for name in WEIR_SERVICES:
        service = compose_services()[name]
        image, _, tag = service["image"].partition(":")
        assert tag == weir.__version__, f"{name}: tag {tag} is not weir {weir.__version__}"
        assert service["build"]["context"] == "."
        dockerfile = ROOT / service["build"]["dockerfile"]
        assert dockerfile.is_file()
        assert image == ("weir-cuda" if dockerfile.suffix == ".cuda" else "weir")


def test_compose_gateway_processes_default_to_one_and_follow_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for env, processes in (({}, 1), ({"WEIR_GATEWAY_PROCESSES": "4"}, 4)):
        gateway = load_compose(env)["services"]["gateway"]
        settings = settings_from(gateway["command"], gateway["environment"], monkeypatch)
        assert isinstance(settings, GatewaySettings)
        assert settings.processes == processes
        assert settings.metrics_port == METRICS_PORT


def test_only_the_compose_gateway_declares_a_metrics_port() -> None:
    # The batcher and workers serve no metrics: the gateway exports theirs from Redis.
    for name in ("batcher", "worker-cpu", "worker-gpu"):
        service = compose_services()[name]
        assert "expose" not in service and "ports" not in service, name


def test_prometheus_scrapes_only_the_gateway_on_its_metrics_port() -> None:
    prometheus = compose_services()["prometheus"]
    mount = next(v for v in prometheus["volumes"] if isinstance(v, dict))
    assert ROOT / mount["source"] == PROMETHEUS_CONFIG and mount["read_only"] is True
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    scraped = {}
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            scraped.update(dict.fromkeys(sd["names"], sd["port"]))
    gateway_port = int(compose_services()["gateway"]["environment"]["WEIR_GATEWAY_METRICS_PORT"])
    assert scraped == {"gateway": gateway_port}


# --- images -----------------------------------------------------------------------------------


def dockerfile_args(text: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.MULTILINE))


def test_dockerfiles_are_multi_stage_non_root_and_pin_the_projects_torch() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_pin = next(d for d in project["optional-dependencies"]["worker"] if d.startswith("torch"))
    for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
        text = (DOCKER / dockerfile).read_text()
        assert len(re.findall(r"^FROM \S+ AS \w+$", text, flags=re.MULTILINE)) >= 2, dockerfile
        users = re.findall(r"^USER (\S+)$", text, flags=re.MULTILINE)
        assert users and users[-1].split(":")[0] not in ("0", "root"), dockerfile
        assert 'VOLUME ["/models"]' in text and "WEIR_REPOSITORY=/models" in text
        assert 'ENTRYPOINT ["tini", "--", "weir-entrypoint"]' in text
        assert f"torch=={dockerfile_args(text)['TORCH_VERSION']}" == torch_pin, dockerfile
    cpu = (DOCKER / "Dockerfile").read_text()
    assert dockerfile_args(cpu)["TORCH_INDEX_URL"].endswith("/whl/cpu")
    gateway_env = compose_services()["gateway"]["environment"]
    http_port, grpc_port = (
        gateway_env["WEIR_GATEWAY_HTTP_PORT"],
        gateway_env["WEIR_GATEWAY_GRPC_PORT"],
    )
    assert f"EXPOSE {http_port} {grpc_port} {METRICS_PORT}" in cpu
    cuda = (DOCKER / "Dockerfile.cuda").read_text()
    assert not re.search(r"^EXPOSE", cuda, flags=re.MULTILINE), "GPU workers listen on no port"
    assert dockerfile_args(cuda)["CUDA_IMAGE"].startswith("nvidia/cuda:")
    assert dockerfile_args(cuda)["TENSORRT_PACKAGE"].startswith("tensorrt")


def test_entrypoint_hands_every_weir_subcommand_to_weir_and_runs_other_programs(
    tmp_path: Path,
) -> None:
    fake = tmp_path / "weir"
    fake.write_text('#!/bin/sh\necho "weir $*"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/local/bin:/usr/bin:/bin"}

    def run(*argv: str) -> str:
        done = subprocess.run(
            ["sh", str(DOCKER / "entrypoint.sh"), *argv],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        return done.stdout.strip()

    for command in cli.COMMANDS:
        assert run(command, "--help") == f"weir {command} --help"
    assert run("weir", "worker", "--pool", "cpu") == "weir worker --pool cpu"
    assert run("echo", "built") == "built"


def test_dockerignore_lets_in_every_package_pip_installs_and_nothing_else() -> None:
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*", "the build context is an allowlist"
    allowed = {rule[1:] for rule in rules if rule.startswith("!")}
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = find["packages"]["find"]["include"]
    packages = {
        path.name
        for path in ROOT.iterdir()
        if (path / "__init__.py").is_file() and any(fnmatch.fnmatch(path.name, p) for p in patterns)
    }
    missing = packages - allowed
    assert not missing, f".dockerignore leaves out packages: {sorted(missing)}"
    assert {"pyproject.toml", "README.md", "deploy/docker/entrypoint.sh"} <= allowed


# --- Kubernetes -------------------------------------------------------------------------------


def test_kustomization_lists_every_manifest_of_the_base() -> None:
    listed = set(kustomization()["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


def test_k8s_objects_validate_against_the_kubernetes_schemas() -> None:
    errors = []
    for document in k8s_documents():
        if (document["apiVersion"], document["kind"]) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{document['kind']}/{document['metadata']['name']}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_k8s_base_has_the_workloads_services_budgets_and_autoscalers() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in k8s_documents()}
    expected = {
        *(("Deployment", name) for name in WEIR_SERVICES),
        ("Service", "gateway"),
        ("ConfigMap", "weir-settings"),
        ("ConfigMap", "weir-gateway"),
        ("PodDisruptionBudget", "gateway"),
        ("HorizontalPodAutoscaler", "gateway"),
        ("ScaledObject", "worker-cpu"),
        ("ScaledObject", "worker-gpu"),
    }
    assert expected <= kinds, sorted(expected - kinds)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders kustomize")
def test_kubectl_kustomize_renders_the_base_with_the_composed_images() -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    documents = [d for d in yaml.safe_load_all(rendered) if d]
    assert {(d["kind"], d["metadata"]["name"]) for d in documents} == {
        (d["kind"], d["metadata"]["name"]) for d in k8s_documents()
    }
    images = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["image"]
        for d in documents
        if d["kind"] == "Deployment"
    }
    assert images == {name: compose_services()[name]["image"] for name in WEIR_SERVICES}


def test_k8s_weir_containers_run_real_commands_with_valid_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, _, container in containers():
        argv = weir_argv(container)
        settings = settings_from(argv, container_env(container, name), monkeypatch)
        assert argv == compose_services()[name]["command"], f"{name} runs something else"
        mount = next(m for m in container["volumeMounts"] if m["name"] == "models")
        assert mount["mountPath"] == str(settings.repository) and mount["readOnly"] is True


def test_k8s_images_are_the_images_compose_builds() -> None:
    for name, _, container in containers():
        assert resolved_image(container["image"]) == compose_services()[name]["image"], name


def test_k8s_settings_agree_with_compose() -> None:
    compose_env = {
        key: value
        for name in WEIR_SERVICES
        for key, value in compose_services()[name]["environment"].items()
    }
    for key, value in configmap_env().items():
        if key in compose_env and key != "WEIR_REDIS_URL":
            assert value == compose_env[key], key
    redis_host = urlsplit(configmap_env()["WEIR_REDIS_URL"]).hostname
    assert redis_host in k8s_objects("Service"), "WEIR_REDIS_URL names no Service"


def test_k8s_gateway_probes_hit_real_health_routes_on_the_port_the_gateway_binds() -> None:
    from starlette.testclient import TestClient

    from gateway.app import create_app

    # No lifespan, so no Redis: a routed path answers something other than 404.
    client = TestClient(create_app(GatewaySettings()), raise_server_exceptions=False)
    gateway = next(c for n, _, c in containers() if n == "gateway")
    ports = {port["name"]: port["containerPort"] for port in gateway["ports"]}
    bound = int(container_env(gateway)["WEIR_GATEWAY_HTTP_PORT"])
    for probe, path in HEALTH_PATHS.items():
        get = gateway[probe]["httpGet"]
        assert get["path"] == path and client.get(path).status_code != 404, probe
        assert ports[get["port"]] == bound, f"{probe} probes a port the gateway does not bind"
    metrics = int(container_env(gateway)["WEIR_GATEWAY_METRICS_PORT"])
    grpc_port = int(container_env(gateway)["WEIR_GATEWAY_GRPC_PORT"])
    assert ports == {"http": bound, "grpc": grpc_port, "metrics": metrics}
    assert (metrics, grpc_port) == (METRICS_PORT, GRPC_PORT)
    service = k8s_objects("Service")["gateway"]
    targets = {port["port"]: ports[port["targetPort"]] for port in service["spec"]["ports"]}
    assert targets == {bound: bound, grpc_port: grpc_port, metrics: metrics}


def test_k8s_only_the_gateway_serves_and_is_annotated_for_metrics() -> None:
    for name, workload in k8s_objects("Deployment").items():
        template = workload["spec"]["template"]
        annotations = template["metadata"].get("annotations", {})
        declared = [p for c in template["spec"]["containers"] for p in c.get("ports", [])]
        if name == "gateway":
            assert annotations["prometheus.io/scrape"] == "true"
            assert annotations["prometheus.io/port"] == str(METRICS_PORT)
            assert annotations["prometheus.io/path"] == "/metrics"
        else:
            # Batcher and workers serve no metrics: the gateway exports theirs from Redis.
            assert not declared, f"{name} declares ports it never listens on"
            assert not any(k.startswith("prometheus.io/") for k in annotations), name


def test_k8s_gateway_runs_a_process_per_requested_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = next(c for n, _, c in containers() if n == "gateway")
    (variable,) = [v for v in gateway["env"] if v["name"] == "WEIR_GATEWAY_PROCESSES"]
    assert variable["valueFrom"]["resourceFieldRef"]["resource"] == "requests.cpu"
    settings = settings_from(weir_argv(gateway), container_env(gateway, "gateway"), monkeypatch)
    assert isinstance(settings, GatewaySettings)
    requested = cpu_cores(gateway["resources"]["requests"]["cpu"])
    assert settings.processes == math.ceil(requested) >= 1


def test_k8s_workers_are_named_after_their_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    # A restarted container of a pod comes back under the pod's name and resumes its batches.
    for name, _, container in containers():
        if not name.startswith("worker-"):
            continue
        (variable,) = [v for v in container["env"] if v["name"] == "WEIR_WORKER_NAME"]
        assert variable["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, name
        env = container_env(container, name)
        settings = settings_from(weir_argv(container), env, monkeypatch)
        assert isinstance(settings, WorkerSettings)
        assert settings.name == POD_NAME.format(workload=name)


def test_k8s_termination_grace_covers_prestop_and_the_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, pod, container in containers():
        env = container_env(container, name)
        settings = settings_from(weir_argv(container), env, monkeypatch)
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {})
        sleep_s = float(pre_stop["command"][1]) if pre_stop else 0.0
        grace = pod["terminationGracePeriodSeconds"]
        assert grace > sleep_s + drain_s(settings), f"{name}: {grace} s cannot fit the drain"
    gateway = next(c for n, _, c in containers() if n == "gateway")
    assert gateway["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_k8s_selectors_budgets_and_hpa_match_the_workloads() -> None:
    pods = {
        name: d["spec"]["template"]["metadata"]["labels"]
        for kind in ("Deployment", "StatefulSet")
        for name, d in k8s_objects(kind).items()
    }
    for kind in ("Deployment", "StatefulSet"):
        for name, d in k8s_objects(kind).items():
            assert selects(d["spec"]["selector"]["matchLabels"], pods[name]), name
    for kind, path in (
        ("Service", ("selector",)),
        ("PodDisruptionBudget", ("selector", "matchLabels")),
    ):
        for name, d in k8s_objects(kind).items():
            selector = d["spec"][path[0]] if len(path) == 1 else d["spec"][path[0]][path[1]]
            matched = [pod for pod, labels in pods.items() if selects(selector, labels)]
            assert matched == [name], f"{kind}/{name} selects {matched}"
    hpa = k8s_objects("HorizontalPodAutoscaler")["gateway"]["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "gateway",
    }
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    gateway = next(c for n, _, c in containers() if n == "gateway")
    assert "cpu" in gateway["resources"]["requests"], "CPU utilization needs a CPU request"


def test_k8s_redis_is_version_7_with_aof() -> None:
    (_, _, redis), *_ = containers("StatefulSet")
    assert redis_major(redis["image"]) >= 7, "KEDA's lagCount needs XINFO GROUPS lag (Redis 7)"
    assert redis["image"] == compose_services()["redis"]["image"]
    assert weir_argv(redis) == compose_services()["redis"]["command"]


_BATCH_STREAM = re.compile(r"^weir:\{(?P<model>[^}]+)\}:(?P<version>\d+):batches$")


def served_by(pool: str, stream: str) -> bool:
    """Whether ``stream`` is the batch stream of an example model that ``pool`` serves."""
    from workers.placement import instance_count

    match = _BATCH_STREAM.match(stream)
    assert match is not None, f"not a batch stream: {stream}"
    model, version = match["model"], match["version"]
    assert names.batch_stream(model, version) == stream
    config = load_config(EXAMPLES / model / "config.yaml", model)
    return instance_count(config, pool) > 0


def test_keda_scales_each_worker_pool_on_the_lag_of_the_batch_streams_it_serves() -> None:
    scaled = k8s_objects("ScaledObject")
    assert set(scaled) == {"worker-cpu", "worker-gpu"}
    for pool_name, scaled_object in scaled.items():
        spec = scaled_object["spec"]
        pool = pool_name.removeprefix("worker-")
        assert spec["scaleTargetRef"]["name"] == pool_name
        streams = [check_lag_trigger(trigger) for trigger in spec["triggers"]]
        assert len(set(streams)) == len(streams), f"{pool_name}: one trigger per stream"
        annotations = scaled_object["metadata"].get("annotations", {})
        if annotations.get("autoscaling.keda.sh/paused-replicas") == "0":
            # Parked until its models move to this pool (the example has no GPU model).
            assert not any(served_by(pool, s) for s in streams), f"{pool_name} is paused"
            continue
        unserved = [s for s in streams if not served_by(pool, s)]
        assert not unserved, f"{pool_name} scales on streams it never reads: {unserved}"
        assert {"weir:{tiny_mlp}:1:batches", "weir:{wide_mlp}:1:batches"} <= set(streams)
        # The gateway is ready only while every model has a live worker: never scale to 0.
        assert spec["minReplicaCount"] >= 1


def check_lag_trigger(trigger: dict[str, Any]) -> str:
    """Check one redis-streams trigger in lagCount mode; return its stream."""
    meta = trigger["metadata"]
    assert trigger["type"] == "redis-streams"
    assert meta["consumerGroup"] == names.WORKER_GROUP
    assert int(meta["lagCount"]) >= 1 and int(meta["activationLagCount"]) >= 0
    assert "pendingEntriesCount" not in meta and "streamLength" not in meta
    host, _, port = meta["address"].rpartition(":")
    service = k8s_objects("Service")["redis"]
    assert host == f"redis.{kustomization()['namespace']}.svc.cluster.local"
    assert int(port) == service["spec"]["ports"][0]["port"]
    return str(meta["stream"])


# --- documentation ----------------------------------------------------------------------------

# Variables of compose.yaml and the Dockerfiles that never reach Weir.
DEPLOY_ONLY_VARIABLES = {
    "WEIR_IMAGE",
    "WEIR_CUDA_IMAGE",
    "WEIR_MODELS_DIR",
    "WEIR_HTTP_PORTS",
    "WEIR_GRPC_PORTS",
    "WEIR_EXTRAS",
    "WEIR_REDIS_MAXMEMORY",
}


def test_every_weir_variable_the_deploy_files_and_docs_name_is_a_real_setting() -> None:
    settings = set().union(
        *(
            setting_env_names(cls)
            for cls in (ServiceSettings, GatewaySettings, BatcherSettings, WorkerSettings)
        ),
        setting_env_names(UpSettings),
    )
    texts = [
        COMPOSE_FILE,
        PROMETHEUS_CONFIG,
        *DEPLOY_DOCS,
        *K8S.glob("*.yaml"),
        *DOCKER.iterdir(),
    ]
    unknown = {
        f"{path.relative_to(ROOT)}: {variable}"
        for path in texts
        for variable in re.findall(r"\bWEIR_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())
        if variable not in settings | DEPLOY_ONLY_VARIABLES
    }
    assert not unknown, sorted(unknown)
