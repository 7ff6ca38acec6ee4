"""A worker SIGKILLed mid-run loses nothing: its pending requests are claimed
by the others, and every request is answered exactly once, correctly."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import numpy as np
import tritonclient.http as httpclient

from broker import channels
from tests.fleet.processes import Fleet, Gateway, ProcessFleet, wait_for
from tests.models import write_python_model
from tests.redis_server import flushdb

# add_sub as a python model that sleeps per batch, so a kill lands while
# batches are being computed rather than between them.
SLOW_ADD_SUB = """
import time

class Model:
    def infer(self, inputs):
        time.sleep(0.02)
        a, b = inputs["INPUT0"], inputs["INPUT1"]
        return {"OUTPUT0": a + b, "OUTPUT1": a - b}
"""
SLOW_ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
MODEL = "add_sub"
REQUESTS = 2_000
CLIENTS = 16
KILL_AFTER = REQUESTS // 3
RESTART_AFTER_S = 0.5
ACK_GRACE_S = 5.0
WORKER_OPTIONS = ("--claim-idle-s", "1.0", "--claim-interval-s", "0.25", "--heartbeat-s", "0.5")
T = TypeVar("T")


def inputs_for(index: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct, exactly representable inputs for each request."""
    a = (index * 16 + np.arange(16, dtype=np.float32)).reshape(1, 16)
    b = (np.arange(16, dtype=np.float32)[::-1] * 0.5 - index).reshape(1, 16)
    return a, b


class Clients:
    """``CLIENTS`` threads, each with its own client, sharing one list of requests."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._next = iter(range(REQUESTS))
        self._lock = threading.Lock()
        self.answered: dict[int, str] = {}  # index -> "" when correct, else what was wrong
        self.calls = Counter[int]()

    def stop(self) -> None:
        with self._lock:
            self._next = iter(())

    def count(self) -> int:
        with self._lock:
            return len(self.answered)

    def run(self) -> None:
        client = httpclient.InferenceServerClient(self._url, connection_timeout=60.0, network_timeout=30.0)
        try:
            while (index := self._take()) is not None:
                verdict = self._one(client, index)
                with self._lock:
                    self.answered[index] = verdict
        finally:
            client.close()

    def _take(self) -> int | None:
        with self._lock:
            index = next(self._next, None)
            if index is not None:
                self.calls[index] += 1
            return index

    def _one(self, client: httpclient.InferenceServerClient, index: int) -> str:
        a, b = inputs_for(index)
        tensors = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        tensors[0].set_data_from_numpy(a)
        tensors[1].set_data_from_numpy(b)
        request_id = f"req-{index}"
        try:
            result = client.infer(MODEL, tensors, request_id=request_id)
        except Exception as exc:  # InferenceServerException for any non-200
            return f"{type(exc).__name__}: {exc}"
        if result.get_response().get("id") != request_id:
            return f"answered with id {result.get_response().get('id')!r}"
        if not (np.array_equal(result.as_numpy("OUTPUT0"), a + b)
                and np.array_equal(result.as_numpy("OUTPUT1"), a - b)):
            return "wrong outputs"
        return ""


def run_with_a_kill(clients: Clients, gateway: Gateway, kill: Callable[[], T],
                    restart: Callable[[], object]) -> tuple[int, T, float]:
    """Every request from ``CLIENTS`` threads; once ``KILL_AFTER`` are answered,
    ``kill()``, and ``restart()`` ``RESTART_AFTER_S`` later. Returns the
    answers counted just after the kill, what ``kill`` returned, and the
    seconds the whole run took."""
    started = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as pool:
        runs = [pool.submit(clients.run) for _ in range(CLIENTS)]
        try:
            wait_for(lambda: clients.count() >= KILL_AFTER or any(run.done() for run in runs), 60.0,
                     f"{KILL_AFTER} answers", gateway)
            killed = kill()
            answered_at_kill = clients.count()
            time.sleep(RESTART_AFTER_S)
            restart()
            for run in runs:
                run.result(timeout=90.0)
        finally:
            clients.stop()  # on failure, leave the requests not sent yet unsent
    return answered_at_kill, killed, time.monotonic() - started


def assert_each_answered_once_and_right(clients: Clients, answered_at_kill: int, fleet: ProcessFleet) -> None:
    assert KILL_AFTER <= answered_at_kill < REQUESTS, f"killed after {answered_at_kill} answers"
    assert all(calls == 1 for calls in clients.calls.values()) and len(clients.calls) == REQUESTS
    wrong = {index: verdict for index, verdict in clients.answered.items() if verdict}
    assert len(clients.answered) == REQUESTS and not wrong, (
        f"{len(wrong)} wrong answers, e.g. {list(wrong.items())[:5]}\n{fleet.describe()}"
    )


def test_a_worker_killed_mid_run_loses_and_repeats_no_answer(redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    repo = tmp_path / "repo"
    write_python_model(repo, MODEL, SLOW_ADD_SUB, SLOW_ADD_SUB_CONFIG)
    with Fleet(redis_url, repo, tmp_path) as fleet:
        gateway = fleet.gateway()
        workers = {worker_id: fleet.worker(worker_id, *WORKER_OPTIONS) for worker_id in ("w1", "w2")}
        fleet.wait_model_ready(gateway, MODEL)

        def kill() -> tuple[str, list[str]]:
            # Kill whichever worker holds more work, so the kill surely strands some.
            victim = max(workers, key=lambda worker_id: fleet.pending(MODEL, worker_id))
            workers[victim].kill()
            return victim, fleet.pending_ids(MODEL, victim)

        clients = Clients(gateway.url)
        answered_at_kill, (victim, stranded), elapsed = run_with_a_kill(
            clients, gateway, kill, lambda: fleet.worker("w3", *WORKER_OPTIONS))

        assert stranded, f"{victim} held no pending work when it was killed"
        assert_each_answered_once_and_right(clients, answered_at_kill, fleet)
        assert_each_request_published_once_and_acked(fleet, stranded)
        survivors = [p for p in fleet.processes if p.name.startswith("worker-") and p.running()]
        claimed = [e for p in survivors for e in p.log_events() if e.get("event") == "worker.claimed"]
        assert sum(event["count"] for event in claimed) >= len(stranded), fleet.describe()
        assert gateway.errors() == [], gateway.describe()
        for process in survivors:
            assert process.errors() == [], process.describe()
        assert elapsed < 60.0, f"{REQUESTS} requests took {elapsed:.1f} s"


def assert_each_request_published_once_and_acked(fleet: Fleet, stranded: list[str]) -> None:
    """What the client cannot see: one request entry per call, nothing left
    pending or dead-lettered, and no more replies than requests except for
    those the killed worker held when it died (it may have replied to them
    before it could ack). Counts, as the streams may be trimmed."""
    assert fleet.entries_added(channels.request_channel(MODEL)) == REQUESTS
    # A worker acks just after it replies, so the last acks may trail the last answers.
    wait_for(lambda: fleet.pending(MODEL) == 0, ACK_GRACE_S, f"{MODEL} requests to be acked")
    assert fleet.dead_letters() == 0

    [reply_stream] = fleet.reply_streams()
    gateway_id = reply_stream.removeprefix(channels.reply_channel(""))
    reply_group = channels.reply_group(gateway_id)
    wait_for(lambda: fleet.redis.xpending(reply_stream, reply_group)["pending"] == 0, ACK_GRACE_S,
             "the gateway to ack every reply")
    repeated = fleet.entries_added(reply_stream) - REQUESTS
    assert 0 <= repeated <= len(stranded), f"{repeated} repeated replies, {len(stranded)} stranded requests"
