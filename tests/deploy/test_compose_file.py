"""compose.yaml holds together with Weir.

No Docker engine runs here (test_compose_local.py plays compose's part, test_compose_docker.py
needs a real engine), so these tests check what can be checked without one: compose.yaml
against the Compose Specification's own schema (shipped by check-jsonschema), and the rest
against Weir itself: every command is a real ``weir`` invocation, every environment variable
a real setting, the model repository and Redis sit on the right mounts, ports and
healthchecks agree with the gateway, grace periods cover the drain, and only the gateway
serves (and Prometheus scrapes) metrics.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from tests.conftest import load_build_models
from tests.deploy.deploy_files import (
    GRPC_PORT,
    METRICS_PORT,
    PROMETHEUS_CONFIG,
    ROOT,
    WEIR_SERVICES,
    Mount,
    compose_mount,
    compose_services,
    drain_s,
    duration_s,
    load_compose,
    redis_major,
    redis_options,
    settings_from,
)
from weir.settings import GatewaySettings, WorkerSettings


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
    assert set(services) == {"models", "redis", *WEIR_SERVICES, "prometheus"}
    profiles = {name: service.get("profiles", []) for name, service in services.items()}
    assert profiles == {
        "models": [],
        "redis": [],
        "gateway": [],
        "batcher": [],
        "worker-cpu": [],
        "worker-gpu": ["gpu"],
        "prometheus": ["observability"],
    }
    # Each Weir service starts once Redis answers and the one-shot has filled the repository.
    for name in WEIR_SERVICES:
        assert services[name]["depends_on"] == {
            "redis": {"condition": "service_healthy"},
            "models": {"condition": "service_completed_successfully"},
        }, name
    assert services["models"]["restart"] == "no", "a one-shot must not restart once it is done"


def test_compose_commands_and_environment_build_valid_settings_for_each_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compose = load_compose()
    own = load_compose({"WEIR_MODELS_DIR": "./examples/models"})
    # The one-shot fills the `models` volume, read-write, where its command builds the repository.
    filled = models_service_repository()
    expected = Mount("models", filled, read_only=False, named=True)
    assert compose_mount(compose, "models", filled) == expected
    for name in WEIR_SERVICES:
        service = compose["services"][name]
        settings = settings_from(service["command"], service["environment"], monkeypatch)
        repository = str(settings.repository)
        mount = compose_mount(compose, name, repository)
        assert mount.read_only, f"{name}: the model repository must be read-only"
        # By default the Weir services read the volume the one-shot filled, ...
        assert mount == Mount("models", repository, read_only=True, named=True), name
        # ... and WEIR_MODELS_DIR mounts a repository of the host instead.
        bind = compose_mount(own, name, repository)
        assert bind == Mount("./examples/models", repository, read_only=True, named=False)
        assert (ROOT / bind.source).is_dir(), f"{name}: no repository at {bind.source}"
        assert urlsplit(settings.redis_url).hostname == "redis"
        if isinstance(settings, WorkerSettings):
            assert name == f"worker-{settings.pool}"


def models_service_repository() -> str:
    """Where the `models` service's command builds the example repository.

    build_models.py's own parser reads the command; its build is replaced, so nothing is built.
    """
    command = compose_services()["models"]["command"]
    assert command[:2] == ["python", "examples/build_models.py"], command
    build_models = load_build_models()
    built: list[Path] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(build_models, "build_repository", lambda root, force: built.append(root))
        try:
            build_models.main(command[2:])
        except SystemExit:
            pytest.fail(f"examples/build_models.py rejects {command[2:]}")
    (repository,) = built
    return str(repository)


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


def test_compose_redis_is_version_7_with_aof_on_its_volume_and_a_ping_healthcheck() -> None:
    compose = load_compose()
    redis = compose["services"]["redis"]
    assert redis_major(redis["image"]) >= 7
    options = redis_options(redis["command"])
    assert options["appendonly"] == "yes"
    # Named, not left to the image's working directory: another image (WEIR_REDIS_IMAGE)
    # would keep the AOF outside the volume.
    assert compose_mount(compose, "redis", options.get("dir", "")) == Mount(
        "redis-data", "/data", read_only=False, named=True
    )
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    mirrored = load_compose({"WEIR_REDIS_IMAGE": "mirror.example/redis:7.2"})
    assert mirrored["services"]["redis"]["image"] == "mirror.example/redis:7.2"


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
    for name in ("models", "batcher", "worker-cpu", "worker-gpu"):
        service = compose_services()[name]
        assert "expose" not in service and "ports" not in service, name


def test_prometheus_scrapes_only_the_gateway_on_its_metrics_port() -> None:
    mount = compose_mount(load_compose(), "prometheus", "/etc/prometheus/prometheus.yml")
    assert ROOT / mount.source == PROMETHEUS_CONFIG and mount.read_only and not mount.named
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    scraped = {}
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            scraped.update(dict.fromkeys(sd["names"], sd["port"]))
    gateway_port = int(compose_services()["gateway"]["environment"]["WEIR_GATEWAY_METRICS_PORT"])
    assert scraped == {"gateway": gateway_port}
