"""deploy/k8s/: every object validated against the Kubernetes OpenAPI schemas (strict) or
KEDA's, and the KEDA scalers pointed at ferry's real streams, topics and groups."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest

from broker import channels
from tests.deploy.manifests import ROOT, k8s_documents, k8s_files, validate_k8s, validate_keda
from workers.repository.layout import ModelRepository
from workers.worker import WorkerSettings


def _all() -> list[tuple[Path, dict]]:
    return [(path, document) for path in k8s_files() for document in k8s_documents(path)]


def _find(kind: str, name: str, folder: str = "") -> dict:
    for path, document in _all():
        if document["kind"] == kind and document["metadata"]["name"] == name and path.parent.name == (folder or "k8s"):
            return document
    raise LookupError(f"no {kind} {name} in deploy/k8s/{folder}")


def _validate(document: dict) -> list[str]:
    if document["apiVersion"].startswith("keda.sh/"):
        return validate_keda([document])[0]
    try:
        validate_k8s(document)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    return []


def test_every_manifest_validates() -> None:
    documents = _all()
    kinds = {document["kind"] for _, document in documents}
    assert {"Namespace", "Deployment", "Service", "ConfigMap", "ScaledObject"} <= kinds
    core = [(p, d) for p, d in documents if not d["apiVersion"].startswith("keda.sh/")]
    keda = [(p, d) for p, d in documents if d["apiVersion"].startswith("keda.sh/")]
    for path, document in core:
        # A kind without a schema raises SchemaNotFoundError here rather than passing unchecked.
        try:
            validate_k8s(document)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.relative_to(ROOT)} {document['kind']}: {'.'.join(map(str, exc.path))}: {exc.message}")
    errors = validate_keda([d for _, d in keda])
    assert {str(p.relative_to(ROOT)): e for (p, _), e in zip(keda, errors) if e} == {}


def _broken(document: dict, change) -> dict:
    copied = copy.deepcopy(document)
    change(copied)
    return copied


def _container(document: dict) -> dict:
    return document["spec"]["template"]["spec"]["containers"][0]


def test_broken_manifests_are_rejected() -> None:
    worker = _find("Deployment", "ferry-worker")
    scaled = _find("ScaledObject", "ferry-worker", "redis")
    broken = {
        "probe port as a list": _broken(worker, lambda d: _container(d)["readinessProbe"]["httpGet"].update(port=[8002])),
        "unknown container field": _broken(worker, lambda d: _container(d).update(argz=["worker"])),
        "resource limit as a list": _broken(worker, lambda d: _container(d)["resources"]["limits"].update({"cpu": ["1"]})),
        "no scaleTargetRef": _broken(scaled, lambda d: d["spec"].pop("scaleTargetRef")),
        "unknown trigger field": _broken(scaled, lambda d: d["spec"]["triggers"][0].update(lagThreshold="5")),
        "unknown spec field": _broken(scaled, lambda d: d["spec"].update(maxReplicas=3)),
        "number in trigger metadata": _broken(scaled, lambda d: d["spec"]["triggers"][0]["metadata"].update(lagCount=5)),
        "replicas as a string": _broken(scaled, lambda d: d["spec"].update(minReplicaCount="1")),
    }
    assert {name: _validate(document) != [] for name, document in broken.items()} == dict.fromkeys(broken, True)
    assert _validate(worker) == [] and _validate(scaled) == []


def test_probes_use_ferrys_health_endpoints_and_workers_get_time_to_drain() -> None:
    expected = {"ferry-gateway": ("http", 8000), "ferry-worker": ("metrics", 8002), "ferry-worker-gpu": ("metrics", 8002)}
    for name, (port_name, port) in expected.items():
        deployment = _find("Deployment", name)
        container = _container(deployment)
        grpc = {"grpc": 8001} if name == "ferry-gateway" else {}
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == {port_name: port, **grpc}
        assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": port_name}
        assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": port_name}
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        # A worker drains its in-flight batches on SIGTERM; give it far longer than a claim takes.
        assert grace >= (60 if "worker" in name else 30), name


def test_the_gpu_worker_asks_for_one_gpu() -> None:
    limits = _container(_find("Deployment", "ferry-worker-gpu"))["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1
    assert _container(_find("Deployment", "ferry-worker-gpu"))["image"].startswith("ferry-gpu:")
    assert "nvidia.com/gpu" not in _container(_find("Deployment", "ferry-worker"))["resources"].get("limits", {})


def _holds() -> dict[str, int]:
    """Per model, what one worker takes off the queue at once: the natural unit of lag."""
    repository = ModelRepository(ROOT / "model_repo")
    prefetch = WorkerSettings().prefetch
    return {name: prefetch * repository.entry(name).config.max_batch_size * repository.entry(name).config.instance_count
            for name in repository.scan().names}


@pytest.mark.parametrize("folder, trigger_type, address", [
    ("redis", "redis-streams", "addressFromEnv"),
    ("redis-cluster", "redis-cluster-streams", "addressesFromEnv"),
])
def test_redis_scalers_read_each_models_stream_and_worker_group(folder: str, trigger_type: str, address: str) -> None:
    scaled = _find("ScaledObject", "ferry-worker", folder)
    assert scaled["spec"]["scaleTargetRef"]["name"] == _find("Deployment", "ferry-worker")["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] >= 1
    broker = _find("ConfigMap", "ferry-broker", folder)["data"]
    holds = _holds()
    lag, pending = {}, {}
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["type"] == trigger_type
        meta = trigger["metadata"]
        model = meta["stream"].split(".")[1]
        assert meta["stream"] == channels.redis_key(channels.request_channel(model))
        assert meta["consumerGroup"] == channels.worker_group(model)
        assert meta[address] in broker
        if "lagCount" in meta:
            lag[model] = int(meta["lagCount"])
        else:
            pending[model] = int(meta["pendingEntriesCount"])
    assert lag == holds and pending == holds


def test_the_cluster_scaler_reads_the_nodes_ferry_is_pointed_at() -> None:
    data = _find("ConfigMap", "ferry-broker", "redis-cluster")["data"]
    nodes = data["FERRY_BROKER"].removeprefix("redis+cluster://")
    assert data["FERRY_REDIS_ADDRESSES"] == nodes
    assert data["FERRY_JOB_STORE"] == data["FERRY_SESSION_STORE"] == data["FERRY_BROKER"]


def test_kafka_scaler_reads_each_models_topic_and_worker_group() -> None:
    scaled = _find("ScaledObject", "ferry-worker", "kafka")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "ferry-worker"
    broker = _find("ConfigMap", "ferry-broker", "kafka")["data"]["FERRY_BROKER"]
    lag = {}
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["type"] == "kafka"
        meta = trigger["metadata"]
        model = meta["topic"].split(".")[1]
        assert meta["topic"] == channels.request_channel(model)
        assert meta["consumerGroup"] == channels.worker_group(model)
        assert meta["bootstrapServers"] == broker.removeprefix("kafka://"), "the scaler reads another cluster"
        lag[model] = int(meta["lagThreshold"])
    assert lag == _holds()
    # More workers than partitions would sit idle (ferry creates 4 per topic by default).
    assert scaled["spec"]["maxReplicaCount"] <= 4


def test_every_deployment_reads_the_broker_configmap_and_sits_in_the_namespace() -> None:
    namespace = _find("Namespace", "ferry")["metadata"]["name"]
    for path, document in _all():
        if document["kind"] != "Namespace":
            assert document["metadata"]["namespace"] == namespace, f"{path.name} {document['kind']}"
        if document["kind"] == "Deployment":
            sources = _container(document)["envFrom"]
            assert sources == [{"configMapRef": {"name": "ferry-broker"}}]
