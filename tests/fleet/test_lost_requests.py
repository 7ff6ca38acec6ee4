"""A request Redis lost in a failure (acknowledged to the gateway, then gone when the server
came back, as with ``appendfsync everysec``) is published again by its gateway and answered,
instead of waiting out the gateway's 300 s reply timeout. Real processes: a gateway and
workers over a real redis-server; the loss is an XDEL of the request's entry, the failure
every client connection dropped, as a restart drops them."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from broker import channels
from broker.channels import redis_key
from tests.fleet.processes import Fleet, wait_for
from tests.models import write_add_sub
from tests.redis_server import flushdb

MODEL = "add_sub"
# Well under the gateway's reply timeout (300 s): a request left waiting fails the test.
CLIENT_TIMEOUT_S = 45.0


def body(value: float) -> dict[str, object]:
    data = [value] * 16
    return {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": data},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": data}]}


def test_a_request_redis_lost_is_published_again_and_answered(redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    repo = tmp_path / "repo"
    write_add_sub(repo, MODEL, max_batch_size=8)
    stream = redis_key(channels.request_channel(MODEL))
    with Fleet(redis_url, repo, tmp_path) as fleet, httpx.Client(timeout=CLIENT_TIMEOUT_S) as http, \
            ThreadPoolExecutor(1) as pool:
        gateway = fleet.gateway()
        first = fleet.worker("w1")
        fleet.wait_model_ready(gateway, MODEL)
        first.send(signal.SIGSTOP)  # reads nothing more; the model is still ready at the gateway
        added = fleet.entries_added(stream)
        answer = pool.submit(http.post, f"http://{gateway.url}/v2/models/{MODEL}/infer", json=body(3.0))
        wait_for(lambda: fleet.entries_added(stream) > added, 10, "the request published", gateway)
        first.kill()  # with whatever it had read
        (lost_id, _), = fleet.redis.xrevrange(stream, count=1)
        assert fleet.redis.xdel(stream, lost_id) == 1
        fleet.redis.client_kill_filter(_type="normal", skipme=True)
        fleet.worker("w2")
        response = answer.result(timeout=CLIENT_TIMEOUT_S + 5)
        assert response.status_code == 200, response.text
        sums = next(o["data"] for o in response.json()["outputs"] if o["name"] == "OUTPUT0")
        assert sums == [6.0] * 16
        sent_again = [e for e in gateway.log_events() if e.get("event") == "lost_requests.sent_again"]
        assert [e["lost_id"] for e in sent_again] == [lost_id.decode()], gateway.describe()
