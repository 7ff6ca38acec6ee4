"""compose.yaml, checked by a real compose implementation (Debian's docker-compose 1.29)."""

from __future__ import annotations

import base64
import graphlib
from pathlib import Path

import pytest
import yaml

from tests.deploy.manifests import ROOT, compose_config, compose_model

COMPOSE = ROOT / "compose.yaml"
FERRY_SERVICES = ("gateway", "worker", "worker-gpu")


@pytest.fixture(scope="module")
def model() -> dict:
    return compose_model(COMPOSE, "gpu")


def test_compose_file_is_valid_with_and_without_the_gpu_profile() -> None:
    services = set(compose_model(COMPOSE)["services"])
    assert {"redis", "kafka", "gateway", "worker", "prometheus", "grafana"} <= services
    assert "worker-gpu" in compose_model(COMPOSE, "gpu")["services"]


def test_the_validator_rejects_a_bad_condition_a_typo_and_a_missing_service(tmp_path: Path) -> None:
    source = yaml.safe_load(COMPOSE.read_text())
    broken = {
        "condition": lambda d: d["services"]["gateway"]["depends_on"]["redis"].update(condition="service_up"),
        "typo": lambda d: d["services"]["worker"].update(healthchek=d["services"]["worker"].pop("healthcheck")),
        "missing": lambda d: d["services"]["grafana"]["depends_on"].update(nosuch={"condition": "service_healthy"}),
    }
    for name, breaks in broken.items():
        document = yaml.safe_load(yaml.safe_dump(source))
        breaks(document)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(document))
        result = compose_config(path)
        assert result.returncode != 0, f"docker-compose accepted the {name} break"
    assert "service_up" in compose_config(tmp_path / "condition.yaml").stderr
    assert "healthchek" in compose_config(tmp_path / "typo.yaml").stderr


def test_services_start_in_order_each_waiting_for_the_health_of_what_it_needs(model: dict) -> None:
    services = model["services"]
    for name in FERRY_SERVICES:
        needs = services[name]["depends_on"]
        assert needs == {"redis": {"condition": "service_healthy"}, "kafka": {"condition": "service_healthy"}}, name
    assert services["prometheus"]["depends_on"] == {"gateway": {"condition": "service_healthy"}}
    assert services["grafana"]["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    graph = {name: set(spec.get("depends_on", {})) for name, spec in services.items()}
    order = list(graphlib.TopologicalSorter(graph).static_order())
    assert order.index("redis") < order.index("gateway") < order.index("prometheus") < order.index("grafana")
    # service_healthy means nothing without a healthcheck on the service waited for.
    for name, spec in services.items():
        for needed, condition in spec.get("depends_on", {}).items():
            if condition["condition"] == "service_healthy":
                assert services[needed].get("healthcheck", {}).get("test"), f"{name} waits on {needed}'s health"


def test_every_service_has_a_healthcheck_of_its_own_kind(model: dict) -> None:
    services = model["services"]
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "/opt/kafka/bin/kafka-broker-api-versions.sh" in " ".join(services["kafka"]["healthcheck"]["test"])
    assert "http://127.0.0.1:8000/v2/health/live" in " ".join(services["gateway"]["healthcheck"]["test"])
    for name in ("worker", "worker-gpu"):
        assert "http://127.0.0.1:8002/v2/health/ready" in " ".join(services[name]["healthcheck"]["test"])
    assert "/-/ready" in " ".join(services["prometheus"]["healthcheck"]["test"])
    assert "/api/health" in " ".join(services["grafana"]["healthcheck"]["test"])


def test_redis_keeps_an_append_only_file_on_a_volume(model: dict) -> None:
    redis = model["services"]["redis"]
    assert redis["command"][:3] == ["redis-server", "--appendonly", "yes"]
    assert any(volume.startswith("redis-data:/data") for volume in redis["volumes"])
    assert redis["image"].startswith("redis:7.")


def test_kafka_is_one_kraft_node_of_the_official_image(model: dict) -> None:
    kafka = model["services"]["kafka"]
    env = kafka["environment"]
    assert kafka["image"].startswith("apache/kafka:")
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert "CONTROLLER" in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
    assert "INTERNAL://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    # Kafka reads the cluster id as 16 bytes of unpadded base64url.
    assert len(base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")) == 16


def test_the_gpu_worker_reserves_an_nvidia_device_behind_a_profile(model: dict) -> None:
    gpu = model["services"]["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["build"]["dockerfile"] == "Dockerfile.gpu"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    for name in ("gateway", "worker"):
        assert "profiles" not in model["services"][name], f"{name} must start without a profile"


def test_mounted_configuration_files_exist(model: dict) -> None:
    for name in ("prometheus", "grafana"):
        for volume in model["services"][name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("/"):
                assert Path(source).exists(), f"{name} mounts {source}, which does not exist"
    assert (ROOT / "deploy/grafana/dashboards/ferry.json").is_file()
