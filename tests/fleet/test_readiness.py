"""Readiness follows the live workers' heartbeats, not the repository."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.fleet.processes import Fleet, Gateway, wait_for
from tests.redis_server import flushdb

MODEL_REPO = Path(__file__).resolve().parent.parent.parent / "model_repo"
HEARTBEAT_S = 0.2
TTL_S = 3 * HEARTBEAT_S  # HeartbeatSettings.ttl_intervals
GATEWAY_REFRESH_S = 0.5  # FleetReadiness's default refresh
# What a loaded 2-core machine may add to TTL plus one refresh.
SLACK_S = 2.0


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    for name in ("add_sub", "text_stats"):
        shutil.copytree(MODEL_REPO / name, repo / name)
    return repo


def readiness(gateway: Gateway) -> dict[str, int]:
    return {
        "server": gateway.status("/v2/health/ready"),
        "add_sub": gateway.status("/v2/models/add_sub/ready"),
        "text_stats": gateway.status("/v2/models/text_stats/ready"),
    }


def test_a_gateway_without_workers_is_live_but_not_ready(redis_url: str, repository: Path, tmp_path: Path):
    flushdb(redis_url)
    with Fleet(redis_url, repository, tmp_path) as fleet:
        gateway = fleet.gateway()
        assert gateway.status("/v2/health/live") == 200
        status = readiness(gateway)
        assert status["server"] == 503, status
        assert status["add_sub"] != 200 and status["text_stats"] != 200, status
        # The model is known, only not served: metadata still answers.
        assert gateway.status("/v2/models/add_sub") == 200


def test_readiness_follows_a_worker_that_starts_and_is_killed(redis_url: str, repository: Path, tmp_path: Path):
    flushdb(redis_url)
    with Fleet(redis_url, repository, tmp_path) as fleet:
        gateway = fleet.gateway()
        assert readiness(gateway)["server"] != 200
        worker = fleet.worker("w-all", "--heartbeat-s", str(HEARTBEAT_S))
        wait_for(lambda: readiness(gateway) == {"server": 200, "add_sub": 200, "text_stats": 200},
                 GATEWAY_REFRESH_S + SLACK_S, "the gateway to see the worker's models", gateway)

        worker.kill()
        # A killed worker cannot delete its key; the TTL has to end it.
        wait_for(lambda: all(code != 200 for code in readiness(gateway).values()),
                 TTL_S + GATEWAY_REFRESH_S + SLACK_S, "readiness to drop after SIGKILL", gateway)
        assert gateway.status("/v2/health/live") == 200


def test_a_worker_serving_one_model_makes_only_that_model_ready(
    redis_url: str, repository: Path, tmp_path: Path
):
    flushdb(redis_url)
    with Fleet(redis_url, repository, tmp_path) as fleet:
        gateway = fleet.gateway()
        fleet.worker("w-text", "--models", "text_stats", "--heartbeat-s", str(HEARTBEAT_S))
        fleet.wait_model_ready(gateway, "text_stats", GATEWAY_REFRESH_S + SLACK_S)
        status = readiness(gateway)
        assert status["text_stats"] == 200, status
        assert status["add_sub"] != 200, status
        # Not every model is served, so the server as a whole is not ready.
        assert status["server"] != 200, status
