"""The Kubernetes base (deploy/k8s) holds together with compose.yaml and Weir.

No cluster runs here, so the objects are checked against the Kubernetes OpenAPI schemas
(shipped by kubernetes-validate) and the rest against Weir itself: every command is a real
``weir`` invocation, every environment variable a real setting (the downward API's pod name
and CPU request included), probes hit real routes on the port the gateway binds, grace
periods cover preStop and the drain, images and settings agree with compose.yaml, selectors
match their workloads, only the gateway serves metrics, and KEDA scales each worker pool on
the batch streams of exactly the models it serves.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from tests.deploy.deploy_files import (
    EXAMPLES,
    GRPC_PORT,
    HEALTH_PATHS,
    K8S,
    METRICS_PORT,
    POD_NAME,
    WEIR_SERVICES,
    compose_services,
    configmap_env,
    container_env,
    containers,
    cpu_cores,
    drain_s,
    k8s_documents,
    k8s_objects,
    kustomization,
    redis_major,
    redis_options,
    resolved_image,
    settings_from,
    weir_argv,
)
from weir import names
from weir.config import load_config
from weir.settings import GatewaySettings, WorkerSettings

# The oldest Kubernetes whose schemas kubernetes-validate ships; the base must apply there.
KUBERNETES_VERSION = "1.29.0"
CUSTOM_KINDS = {("keda.sh/v1alpha1", "ScaledObject")}


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
    options = redis_options(weir_argv(redis))
    composed = redis_options(compose_services()["redis"]["command"])
    # Without --dir Redis writes to its working directory: the official image's is /data.
    (data,) = redis["volumeMounts"]
    assert data["mountPath"] == options.pop("dir", "/data") == composed.pop("dir")
    assert options == composed


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
