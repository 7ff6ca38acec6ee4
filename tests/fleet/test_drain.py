"""SIGTERM drains a worker: what it took is answered and acked before it exits."""

from __future__ import annotations

import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from broker import channels
from tests.fleet.processes import Fleet, wait_for
from tests.models import write_slow_model
from tests.redis_server import flushdb

SLOW_S = 0.5
# Two batches of four, about a second of work; all of it is taken at once, as
# a worker holds up to prefetch (2) rounds of its capacity (4 rows x 1 instance).
REQUESTS = 8
DRAIN_LIMIT_S = 5.0


def infer(url: str, index: int) -> tuple[int, np.ndarray]:
    x = np.full((1, 4), index, dtype=np.float32)
    tensor = httpclient.InferInput("X", [1, 4], "FP32")
    tensor.set_data_from_numpy(x)
    client = httpclient.InferenceServerClient(url, network_timeout=60.0)
    try:
        result = client.infer("slow", [tensor], request_id=f"drain-{index}")
        return index, result.as_numpy("Y")
    finally:
        client.close()


def test_sigterm_answers_and_acks_every_request_in_flight_then_exits_0(redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    repo = tmp_path / "repo"
    write_slow_model(repo, "slow", SLOW_S, max_batch_size=4, delay_us=100_000)
    # The fleet stops first on the way out, so clients left waiting fail fast.
    with ThreadPoolExecutor(REQUESTS) as clients, Fleet(redis_url, repo, tmp_path) as fleet:
        gateway = fleet.gateway()
        worker = fleet.worker("drainer")
        fleet.wait_model_ready(gateway, "slow")

        calls: list[Future[tuple[int, np.ndarray]]] = [
            clients.submit(infer, gateway.url, i) for i in range(REQUESTS)
        ]
        wait_for(lambda: fleet.pending("slow", "drainer") == REQUESTS, 30.0,
                 "the worker to take every request", worker)
        answered_before = sum(call.done() for call in calls)
        worker.send(signal.SIGTERM)
        stopped_at = time.monotonic()
        code = worker.wait(DRAIN_LIMIT_S + 5.0)
        drain_s = time.monotonic() - stopped_at

        assert answered_before < REQUESTS, "nothing was in flight when SIGTERM was sent"
        assert code == 0, f"worker exit code {code} after SIGTERM\n{fleet.describe()}"
        assert drain_s < DRAIN_LIMIT_S, f"drain took {drain_s:.1f} s\n{fleet.describe()}"
        for call in calls:
            index, y = call.result(timeout=10)  # a non-200 answer raises InferenceServerException
            np.testing.assert_array_equal(y, np.full((1, 4), 2 * index, dtype=np.float32))
        assert fleet.pending("slow") == 0
        assert not fleet.redis.exists(channels.heartbeat_key("drainer"))
        assert fleet.dead_letters() == 0
        events = [event.get("event") for event in worker.log_events()]
        assert "worker.stopping" in events and "worker.stopped" in events, worker.describe()
        assert worker.errors() == [], worker.describe()
