"""Async jobs over real ``ferry gateway`` and ``ferry worker`` processes and
a real Redis job store: submit, poll, running, cancel, expire, and a poll
answered by a gateway that did not take the job."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker import channels
from tests.fleet.processes import Fleet, Gateway, wait_for
from tests.models import recorded_values, write_recording_model
from tests.redis_server import flushdb

MODEL = "recorder"
ASYNC = {"Prefer": "respond-async"}
POLL_TIMEOUT_S = 20.0
SLOW_S = 1.0
# WorkerSettings.prefetch: a worker holds up to this many rounds of its
# single instance's capacity (one request) in flight.
PREFETCH = 2


@pytest.fixture
def record(tmp_path: Path) -> Path:
    return tmp_path / "computed.txt"


def repository(tmp_path: Path, record: Path, delay_s: float = 0.0) -> Path:
    repo = tmp_path / "repo"
    write_recording_model(repo, MODEL, record, delay_s=delay_s)
    return repo


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30.0) as client:
        yield client


def body(value: int, binary_output: bool = False) -> dict[str, Any]:
    return {"id": f"req-{value}", "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [value]}],
            "parameters": {"binary_data_output": binary_output}}


def infer_url(gateway: Gateway) -> str:
    return f"http://{gateway.url}/v2/models/{MODEL}/infer"


def job_url(gateway: Gateway, job_id: str) -> str:
    return f"http://{gateway.url}/v2/jobs/{job_id}"


def submit(http: httpx.Client, gateway: Gateway, payload: dict[str, Any]) -> str:
    response = http.post(infer_url(gateway), json=payload, headers=ASYNC)
    assert response.status_code == 202, f"{response.status_code} {response.text}\n{gateway.describe()}"
    job_id = str(response.json()["job_id"])
    assert response.headers["location"] == f"/v2/jobs/{job_id}"
    assert response.json()["status"] == "queued"
    return job_id


def status_of(response: httpx.Response) -> str | None:
    """The job status a poll reports; None for a finished job's inference body."""
    if response.headers.get("content-type") != "application/json":
        return None
    document = response.json()
    return str(document["status"]) if isinstance(document, dict) and "job_id" in document else None


def poll_until(http: httpx.Client, gateway: Gateway, job_id: str, done: set[str | None],
               seen: list[str | None] | None = None) -> httpx.Response:
    """Poll until the status is in ``done`` (None: the finished body)."""
    deadline = time.monotonic() + POLL_TIMEOUT_S
    while time.monotonic() < deadline:
        response = http.get(job_url(gateway, job_id))
        assert response.status_code == 200, f"{response.status_code} {response.text}\n{gateway.describe()}"
        status = status_of(response)
        if seen is not None and (not seen or seen[-1] != status):
            seen.append(status)
        if status in done:
            return response
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} not {done} within {POLL_TIMEOUT_S} s\n{gateway.describe()}")


def assert_same_response(job: httpx.Response, sync: httpx.Response) -> None:
    assert job.status_code == sync.status_code == 200
    assert job.content == sync.content
    for header in ("content-type", "inference-header-content-length"):
        assert job.headers.get(header) == sync.headers.get(header), header


def test_a_job_over_real_processes_finishes_with_the_synchronous_body(
    fleet_redis_url: str, tmp_path: Path, record: Path, http: httpx.Client,
):
    with Fleet(fleet_redis_url, repository(tmp_path, record), tmp_path) as fleet:
        gateway = fleet.gateway()
        fleet.worker("w0")
        fleet.wait_model_ready(gateway, MODEL)
        for value, binary_output in ((7, False), (8, True)):
            sync = http.post(infer_url(gateway), json=body(value, binary_output))
            job_id = submit(http, gateway, body(value, binary_output))
            done = poll_until(http, gateway, job_id, {None, "failed"})
            assert_same_response(done, sync)
            assert ("inference-header-content-length" in done.headers) == binary_output
        assert recorded_values(record) == [7, 7, 8, 8]


def test_a_polled_job_reports_running_while_the_model_computes(
    redis_url: str, tmp_path: Path, record: Path, http: httpx.Client,
):
    flushdb(redis_url)
    with Fleet(redis_url, repository(tmp_path, record, delay_s=SLOW_S), tmp_path) as fleet:
        gateway = fleet.gateway()
        fleet.worker("w0")
        fleet.wait_model_ready(gateway, MODEL)
        seen: list[str | None] = []
        job_id = submit(http, gateway, body(3))
        poll_until(http, gateway, job_id, {"running"}, seen)
        # The worker marks the job running as it takes it, a moment before the model is called.
        wait_for(lambda: recorded_values(record) == [3], SLOW_S, "the model to compute the job")
        refused = http.delete(job_url(gateway, job_id))
        assert refused.status_code == 409 and "error" in refused.json(), refused.text
        done = poll_until(http, gateway, job_id, {None, "failed"}, seen)
    assert seen == ["queued", "running", None] or seen == ["running", None], seen
    assert done.json()["outputs"][0]["data"] == [6]
    assert recorded_values(record) == [3]


def test_a_job_cancelled_before_it_starts_is_never_computed(
    redis_url: str, tmp_path: Path, record: Path, http: httpx.Client,
):
    flushdb(redis_url)
    with Fleet(redis_url, repository(tmp_path, record, delay_s=SLOW_S), tmp_path) as fleet:
        gateway = fleet.gateway()
        fleet.worker("w0")
        fleet.wait_model_ready(gateway, MODEL)
        # Fill the worker's prefetch with slow synchronous requests, so the
        # jobs stay on the stream: a job a worker has taken is already running.
        with ThreadPoolExecutor(PREFETCH) as pool:
            busy = [pool.submit(http.post, infer_url(gateway), json=body(value)) for value in range(PREFETCH)]
            wait_for(lambda: fleet.pending(MODEL, "w0") == PREFETCH, POLL_TIMEOUT_S, "the worker to be full")
            cancelled_id = submit(http, gateway, body(50))
            later_id = submit(http, gateway, body(60))

            cancelled = http.delete(job_url(gateway, cancelled_id))
            assert cancelled.status_code == 200, cancelled.text
            assert cancelled.json()["status"] == "cancelled"
            assert [future.result(timeout=POLL_TIMEOUT_S).status_code for future in busy] == [200] * PREFETCH

        poll_until(http, gateway, later_id, {"running"})
        running = http.delete(job_url(gateway, later_id))
        poll_until(http, gateway, later_id, {None, "failed"})
        finished = http.delete(job_url(gateway, later_id))
        wait_for(lambda: fleet.pending(MODEL) == 0, POLL_TIMEOUT_S, "every request to be acked")
        polled = http.get(job_url(gateway, cancelled_id))

    assert running.status_code == 409 and "running" in running.json()["error"], running.text
    assert finished.status_code == 409 and "succeeded" in finished.json()["error"], finished.text
    assert polled.status_code == 200 and polled.json()["status"] == "cancelled", polled.text
    assert fleet.entries_added(channels.request_channel(MODEL)) == PREFETCH + 2
    assert sorted(recorded_values(record)) == [*range(PREFETCH), 60], "the cancelled job was computed"


JOB_TTL_S = 2.0


def test_a_job_past_its_ttl_is_forgotten_and_the_gateway_serves_on(
    redis_url: str, tmp_path: Path, record: Path, http: httpx.Client,
):
    """``ferry gateway --job-ttl-s``: the Redis store's key expires with the
    job, so a poll after the TTL is an unknown job (404), not 410."""
    flushdb(redis_url)
    with Fleet(redis_url, repository(tmp_path, record), tmp_path) as fleet:
        gateway = fleet.gateway("--job-ttl-s", str(JOB_TTL_S))
        fleet.worker("w0")
        fleet.wait_model_ready(gateway, MODEL)
        job_id = submit(http, gateway, body(4))
        submitted = time.monotonic()
        poll_until(http, gateway, job_id, {None})
        wait_for(lambda: http.get(job_url(gateway, job_id)).status_code != 200, JOB_TTL_S + 5,
                 "the job to expire", gateway)
        expired_after = time.monotonic() - submitted
        polled = http.get(job_url(gateway, job_id))
        cancelled = http.delete(job_url(gateway, job_id))
        assert polled.status_code == 404 and "error" in polled.json(), polled.text
        assert cancelled.status_code == 404, cancelled.text
        assert expired_after >= JOB_TTL_S - 0.1, f"expired after {expired_after:.2f} s"
        assert not fleet.redis.exists(channels.job_key(job_id))
        assert http.post(infer_url(gateway), json=body(5)).json()["outputs"][0]["data"] == [10]
        assert gateway.running() and gateway.errors() == [], gateway.describe()


def test_a_job_is_answered_by_a_second_gateway_after_the_first_stopped(
    redis_url: str, tmp_path: Path, record: Path, http: httpx.Client,
):
    flushdb(redis_url)
    with Fleet(redis_url, repository(tmp_path, record), tmp_path) as fleet:
        first = fleet.gateway()
        # Killed, its heartbeat outlives it for three intervals: long enough
        # for the first gateway to still take the job, which nothing computes.
        doomed = fleet.worker("w-doomed", "--heartbeat-s", "2")
        fleet.wait_model_ready(first, MODEL)
        doomed.kill()
        job_id = submit(http, first, body(9, binary_output=True))
        first.stop()
        # uvicorn shuts down gracefully, then re-raises the SIGTERM it caught.
        assert first.process.returncode in (0, -signal.SIGTERM), first.log_path.read_text()
        assert "Traceback" not in first.log_path.read_text(), first.log_path.read_text()
        assert recorded_values(record) == []

        second = fleet.gateway()
        fleet.worker("w-after")
        fleet.wait_model_ready(second, MODEL)
        done = poll_until(http, second, job_id, {None, "failed"})
        sync = http.post(infer_url(second), json=body(9, binary_output=True))
        assert_same_response(done, sync)
        assert recorded_values(record) == [9, 9]
