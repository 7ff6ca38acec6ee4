"""A request Redis lost in a failure (acknowledged to the gateway, then gone when the server
came back, as with ``appendfsync everysec``) is published again by its gateway and answered,
instead of waiting out the gateway's 300 s reply timeout. Real processes: a gateway and
workers over a real redis-server; the loss is an XDEL of the request's entry, the failure
every client connection dropped, as a restart drops them."""

from __future__ import annotations

import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx

from broker import channels
from broker.channels import redis_key
from tests.fleet.processes import Fleet, FerryProcess, Gateway, wait_for
from tests.models import write_add_sub
from tests.workers.sequences.accumulator import write_accumulator
from tests.redis_server import flushdb

MODEL = "add_sub"
# Well under the gateway's reply timeout (300 s): a request left waiting fails the test.
CLIENT_TIMEOUT_S = 45.0
T = TypeVar("T")


def body(value: float) -> dict[str, object]:
    data = [value] * 16
    return {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": data},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": data}]}


def lose_the_next_request(fleet: Fleet, worker: FerryProcess, publish: Callable[[], T],
                          channel: str = channels.request_channel(MODEL)) -> T:
    """With ``worker`` stopped, ``publish`` a request onto ``channel``; then the broker comes back
    without it: the worker killed with whatever it had read, the entry deleted, every connection
    dropped. Returns what ``publish`` returned; a second worker is started to answer."""
    stream = redis_key(channel)
    worker.send(signal.SIGSTOP)  # reads nothing more; the model is still ready at the gateway
    added = fleet.entries_added(stream)
    published = publish()
    wait_for(lambda: fleet.entries_added(stream) > added, 10, "the request published")
    worker.kill()
    (lost_id, _), = fleet.redis.xrevrange(stream, count=1)
    assert fleet.redis.xdel(stream, lost_id) == 1
    fleet.redis.client_kill_filter(_type="normal", skipme=True)
    fleet.worker("w2")
    return published


def sent_again(gateway: Gateway) -> list[dict[str, Any]]:
    return [event for event in gateway.log_events() if event.get("event") == "lost_requests.sent_again"]


def lost_metric(http: httpx.Client, gateway: Gateway, model: str, kind: str, outcome: str) -> float | None:
    """``ferry_lost_requests_total`` for one model, kind and outcome on the gateway's /metrics."""
    wanted = f'ferry_lost_requests_total{{kind="{kind}",model="{model}",outcome="{outcome}"}}'
    for line in http.get(f"http://{gateway.url}/metrics").text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == wanted:
            return float(value)
    return None


def test_a_request_redis_lost_is_published_again_and_answered(redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    repo = tmp_path / "repo"
    write_add_sub(repo, MODEL, max_batch_size=8)
    with Fleet(redis_url, repo, tmp_path) as fleet, httpx.Client(timeout=CLIENT_TIMEOUT_S) as http, \
            ThreadPoolExecutor(1) as pool:
        gateway = fleet.gateway()
        worker = fleet.worker("w1")
        fleet.wait_model_ready(gateway, MODEL)
        answer = lose_the_next_request(fleet, worker, lambda: pool.submit(
            http.post, f"http://{gateway.url}/v2/models/{MODEL}/infer", json=body(3.0)))
        response = answer.result(timeout=CLIENT_TIMEOUT_S + 5)
        assert response.status_code == 200, response.text
        sums = next(o["data"] for o in response.json()["outputs"] if o["name"] == "OUTPUT0")
        assert sums == [6.0] * 16
        assert len(sent_again(gateway)) == 1, gateway.describe()
        assert lost_metric(http, gateway, "add_sub", "request", "sent_again") == 1.0


def test_an_async_job_redis_lost_is_published_again_and_succeeds(redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    repo = tmp_path / "repo"
    write_add_sub(repo, MODEL, max_batch_size=8)
    with Fleet(redis_url, repo, tmp_path) as fleet, httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
        gateway = fleet.gateway()
        worker = fleet.worker("w1")
        fleet.wait_model_ready(gateway, MODEL)
        submitted = lose_the_next_request(fleet, worker, lambda: http.post(
            f"http://{gateway.url}/v2/models/{MODEL}/infer", json=body(4.0), headers={"Prefer": "respond-async"}))
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["job_id"]
        result: list[httpx.Response] = []

        def final() -> bool:
            result[:] = [http.get(f"http://{gateway.url}/v2/jobs/{job_id}")]
            return result[0].headers.get("content-type") != "application/json" or \
                result[0].json().get("status") not in ("queued", "running")

        wait_for(final, CLIENT_TIMEOUT_S, f"job {job_id} final (it stays queued if its request is lost)", gateway,
                 interval_s=0.5)
        assert result[0].status_code == 200, result[0].text
        sums = next(o["data"] for o in result[0].json()["outputs"] if o["name"] == "OUTPUT0")
        assert sums == [8.0] * 16
        assert [event["request_id"] for event in sent_again(gateway)] == [job_id], gateway.describe()
        assert lost_metric(http, gateway, "add_sub", "job", "sent_again") == 1.0
        assert lost_metric(http, gateway, "add_sub", "request", "sent_again") is None


def test_a_sequence_step_redis_lost_is_answered_503_not_sent_again(redis_url: str, tmp_path: Path):
    """A step changes its sequence's state and may have been applied before the loss: sending it
    again could apply it twice, so its client is told instead. (The gateway looks only for a
    step it sent to its sequence's session channel: one on the model's channel may have been
    forwarded by the worker that read it.)"""
    flushdb(redis_url)
    repo = tmp_path / "repo"
    write_accumulator(repo)
    url = "/v2/models/accumulator/infer"
    with Fleet(redis_url, repo, tmp_path) as fleet, httpx.Client(timeout=CLIENT_TIMEOUT_S) as http, \
            ThreadPoolExecutor(1) as pool:
        gateway = fleet.gateway()
        worker = fleet.worker("w1")
        fleet.wait_model_ready(gateway, "accumulator")
        started = http.post(f"http://{gateway.url}{url}", json=step(5, start=True))
        assert started.status_code == 200, started.text
        home = started.json()["parameters"]["sequence_channel"]
        assert home == channels.session_channel("accumulator", "w1")
        answer = lose_the_next_request(fleet, worker, lambda: pool.submit(
            http.post, f"http://{gateway.url}{url}", json=step(2)), channel=home)
        response = answer.result(timeout=CLIENT_TIMEOUT_S + 5)
        assert response.status_code == 503, response.text
        message = response.json()["error"]
        assert "lost" in message and "not safe" in message and home in message, message
        assert sent_again(gateway) == []
        assert lost_metric(http, gateway, "accumulator", "request", "failed") == 1.0


def step(x: int, start: bool = False) -> dict[str, object]:
    return {"parameters": {"sequence_id": 7, "sequence_start": start},
            "inputs": [{"name": "X", "shape": [1, 1], "datatype": "INT32", "data": [x]}]}
