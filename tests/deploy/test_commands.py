"""Every ferry command in compose.yaml, the k8s manifests and the Dockerfiles is one ferry's
own parser accepts, on the ports and paths the rest of the file expects."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.deploy.commands import BadCommand, broker_endpoint, parse_ferry
from tests.deploy.manifests import (
    K8S, ROOT, as_argv, compose_model, container_commands, expand_k8s, k8s_documents, k8s_files,
    parse_dockerfile,
)

COMPOSE = ROOT / "compose.yaml"
BROKERS = {"redis://redis:6379/0": ("redis", 6379), "kafka://kafka:9092": ("kafka", 9092)}


def check_compose_service(services: dict, name: str) -> None:
    """The service's command is a ferry command whose ports, paths and brokers match the file."""
    service = services[name]
    args = parse_ferry(as_argv(service["command"]), f"compose service {name}")
    assert args.command in ("gateway", "worker"), name
    assert str(args.model_repository) == "/models", f"{name}: the images keep the repository at /models"
    for url in (args.broker, args.job_store, getattr(args, "session_store", "")):
        if url:
            scheme, host, port = broker_endpoint(url, f"compose service {name}")
            assert host in services, f"{name}: {url} names no compose service"
            assert port in {BROKERS[u][1] for u in BROKERS if u.startswith(scheme)}, f"{name}: {url}"
    port = args.http_port if args.command == "gateway" else args.metrics_port
    targets = {int(mapping["target"]) for mapping in service.get("ports", [])}
    assert port in targets, f"{name}: ferry listens on {port}, compose publishes {targets}"
    if args.command == "gateway":
        assert args.grpc_port in targets, f"{name}: gRPC listens on {args.grpc_port}, compose publishes {targets}"
    health = " ".join(service["healthcheck"]["test"])
    assert f"127.0.0.1:{port}/v2/health/" in health, f"{name}: the healthcheck asks another port"


@pytest.mark.parametrize("broker", sorted(BROKERS))
def test_compose_commands_parse_for_either_broker(broker: str) -> None:
    services = compose_model(COMPOSE, "gpu", env={**os.environ, "FERRY_BROKER": broker})["services"]
    for name in ("gateway", "worker", "worker-gpu"):
        check_compose_service(services, name)
        assert parse_ferry(as_argv(services[name]["command"]), name).broker == broker


def test_a_broken_compose_command_is_caught(tmp_path: Path) -> None:
    document = yaml.safe_load(COMPOSE.read_text())
    document["services"]["worker"]["command"] = document["services"]["worker"]["command"] + ["--metrics-prot", "8002"]
    gateway = document["services"]["gateway"]
    gateway["command"] = [part.replace("8000", "8003") for part in gateway["command"]]
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(document))
    services = compose_model(path)["services"]
    with pytest.raises(BadCommand, match="unrecognized arguments: --metrics-prot"):
        check_compose_service(services, "worker")
    with pytest.raises(AssertionError, match="listens on 8003"):
        check_compose_service(services, "gateway")


def _configmaps() -> dict[str, dict[str, str]]:
    """Each broker variant's ferry-broker ConfigMap data, by variant folder."""
    found = {}
    for path in k8s_files():
        for document in k8s_documents(path):
            if document["kind"] == "ConfigMap" and document["metadata"]["name"] == "ferry-broker":
                found[path.parent.name] = document["data"]
    return found


def check_k8s_container(document: dict, container: dict, argv: list[str], env: dict[str, str], where: str) -> None:
    unresolved = [part for part in argv if "$(" in part]
    assert not unresolved, f"{where}: {unresolved} name no variable the pod defines"
    args = parse_ferry(argv, where)
    assert args.command in ("gateway", "worker"), where
    assert str(args.model_repository) == "/models", where
    broker_endpoint(args.broker, where)
    ports = {port["name"]: port["containerPort"] for port in container.get("ports", [])}
    expected = ({"http": args.http_port, "grpc": args.grpc_port} if args.command == "gateway"
                else {"metrics": args.metrics_port})
    assert ports == expected, f"{where}: ferry listens on {expected}, the container declares {ports}"
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] in ports and get["path"].startswith("/v2/health/"), f"{where}: {probe}"


def test_k8s_commands_parse_for_each_broker_configmap() -> None:
    configmaps = _configmaps()
    assert set(configmaps) == {"redis", "redis-cluster", "kafka"}
    workloads = [d for path in k8s_files() for d in k8s_documents(path) if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in workloads} == {"ferry-gateway", "ferry-worker", "ferry-worker-gpu"}
    for variant, data in configmaps.items():
        for document in workloads:
            containers = {c["name"]: c for c in document["spec"]["template"]["spec"]["containers"]}
            for name, argv, env in container_commands(document):
                container = containers[name]
                assert container.get("command") in (None, ["ferry"]), f"{name}: the image's entrypoint is ferry"
                pod_env = {**data, **env, "POD_NAME": "ferry-worker-0"}
                where = f"{document['metadata']['name']}/{name} with {variant}/broker.yaml"
                check_k8s_container(document, container, [expand_k8s(a, pod_env) for a in argv], pod_env, where)


def test_a_broken_k8s_command_is_caught() -> None:
    document = k8s_documents(K8S / "worker.yaml")[0]
    container = document["spec"]["template"]["spec"]["containers"][0]
    env = {**_configmaps()["redis"], "POD_NAME": "w"}
    argv = [expand_k8s(a, env) for a in container["args"]]
    with pytest.raises(BadCommand, match="unrecognized arguments: --drain"):
        check_k8s_container(document, container, argv + ["--drain"], env, "worker")
    with pytest.raises(AssertionError, match="name no variable"):
        check_k8s_container(document, container, argv + ["--worker-id", "$(NODE_NAME)"], env, "worker")


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_the_images_default_command_is_a_ferry_command(name: str) -> None:
    parser = parse_dockerfile(ROOT / name)
    entrypoint = [i for i in parser.structure if i["instruction"] == "ENTRYPOINT"]
    cmd = [i for i in parser.structure if i["instruction"] == "CMD"]
    assert yaml.safe_load(entrypoint[-1]["value"]) == ["ferry"]
    args = parse_ferry(yaml.safe_load(cmd[-1]["value"]), name)
    assert str(args.model_repository) == "/models"
