"""Async jobs through a gateway on Kafka: results in Redis (``--job-store``),
so a second gateway answers the poll; or in the gateway's memory without it."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet.processes import FerryProcess, Gateway, wait_for
from tests.kafka_fleet.processes import KafkaFleet
from tests.redis_server import flushdb

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"
BODY = json.dumps({
    "id": "job-req",
    "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))},
               {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [2] * 16}],
}).encode()


@pytest.fixture
def fleet(kafka_bootstrap: str, tmp_path: Path) -> Iterator[KafkaFleet]:
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "repo" / "add_sub")
    with KafkaFleet(kafka_bootstrap, tmp_path / "repo", tmp_path) as started:
        yield started


def post(gateway: Gateway, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"http://{gateway.url}/v2/models/add_sub/infer", data=BODY,
                                     headers={"content-type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()


def poll(gateway: Gateway, job_id: str, timeout_s: float = 60) -> bytes:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://{gateway.url}/v2/jobs/{job_id}", timeout=10) as response:
            body = response.read()
        decoded = json.loads(body)
        if decoded.get("status") not in ("queued", "running"):
            return body
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish within {timeout_s} s")


def ready(gateway: Gateway, worker: FerryProcess) -> None:
    wait_for(lambda: gateway.status("/v2/models/add_sub/ready") == 200, 90, "add_sub ready", worker)


def test_a_job_stored_in_redis_is_answered_by_another_gateway(fleet: KafkaFleet, redis_url: str):
    flushdb(redis_url)
    store = ("--job-store", redis_url)
    first, worker = fleet.gateway(*store), fleet.worker("w1", "--models", "add_sub", *store)
    ready(first, worker)
    status, headers, accepted = post(first, {"Prefer": "respond-async"})
    assert status == 202 and headers["location"].startswith("/v2/jobs/")
    job_id = json.loads(accepted)["job_id"]
    second = fleet.gateway(*store)
    ready(second, worker)
    finished = poll(second, job_id)
    _, _, synchronous = post(second, {})
    assert json.loads(finished) == json.loads(synchronous)
    outputs = {o["name"]: o["data"] for o in json.loads(finished)["outputs"]}
    assert outputs["OUTPUT0"] == [v + 2.0 for v in range(16)]


def test_without_a_job_store_the_gateway_that_took_a_job_answers_it(fleet: KafkaFleet):
    gateway, worker = fleet.gateway(), fleet.worker("w1", "--models", "add_sub")
    ready(gateway, worker)
    status, _, accepted = post(gateway, {"Prefer": "respond-async"})
    assert status == 202
    finished = json.loads(poll(gateway, json.loads(accepted)["job_id"]))
    assert finished["id"] == "job-req" and len(finished["outputs"]) == 2
