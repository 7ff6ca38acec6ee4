"""A worker SIGKILLed mid-run loses nothing, and every request is answered
exactly once, correctly. Over Redis its pending requests are claimed by the
others; over Kafka, when its group session times out, its partitions go to
the other worker, which reads on from the committed offsets."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
import tritonclient.http as httpclient

from broker import channels
from tests.brokers import FLEET_BROKERS, open_fleet
from tests.fleet.processes import Fleet, FerryProcess, Gateway, ProcessFleet, wait_for
from tests.kafka_fleet.processes import KafkaFleet
from tests.kafka_server import create_topic
from tests.models import write_slow_add_sub

# add_sub as a python model that sleeps per batch, so a kill lands while
# batches are being computed rather than between them.
SLOW_S = 0.02
MODEL = "add_sub"
REQUESTS = 2_000
CLIENTS = 16
KILL_AFTER = REQUESTS // 3
RESTART_AFTER_S = 0.5
ACK_GRACE_S = 5.0
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


class RedisCrash:
    """Kills whichever worker holds more work, so the kill surely strands some,
    and sees the others claim it."""

    options = ("--claim-idle-s", "1.0", "--claim-interval-s", "0.25", "--heartbeat-s", "0.5")
    kafka_query = ""
    budget_s = 60.0

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.workers: dict[str, FerryProcess] = {}

    def kill(self) -> tuple[str, list[str]]:
        victim = max(self.workers, key=lambda worker_id: self.fleet.pending(MODEL, worker_id))
        self.workers[victim].kill()
        return victim, self.fleet.pending_ids(MODEL, victim)

    def restart(self) -> None:
        self.fleet.worker("w3", *self.options)

    def assert_nothing_lost(self, killed: tuple[str, list[str]], answered_at_kill: int, elapsed: float) -> None:
        victim, stranded = killed
        fleet = self.fleet
        assert stranded, f"{victim} held no pending work when it was killed"
        assert_each_request_published_once_and_acked(fleet, stranded)
        survivors = [p for p in fleet.processes if p.name.startswith("worker-") and p.running()]
        claimed = [e for p in survivors for e in p.log_events() if e.get("event") == "worker.claimed"]
        assert sum(event["count"] for event in claimed) >= len(stranded), fleet.describe()
        for process in survivors:
            assert process.errors() == [], process.describe()


class KafkaCrash:
    """Kills w1 and starts it again; its partitions move when its session times out."""

    options = ("--models", MODEL, "--heartbeat-s", "0.5")
    # The broker's floor (group.min.session.timeout.ms): a dead member's partitions move after this.
    kafka_query = "session_timeout_ms=6000"
    budget_s = 90.0
    partitions = 4

    def __init__(self, fleet: KafkaFleet) -> None:
        self.fleet = fleet
        self.workers: dict[str, FerryProcess] = {}
        self.request_topic = fleet.topic(channels.request_channel(MODEL))
        create_topic(fleet.bootstrap, self.request_topic, self.partitions)

    def kill(self) -> None:
        self.workers["w1"].kill()

    def restart(self) -> None:
        self.fleet.worker("w1", *self.options, wait=False)

    def assert_nothing_lost(self, killed: None, answered_at_kill: int, elapsed: float) -> None:
        fleet = self.fleet
        assert fleet.kcat.partitions(self.request_topic) == self.partitions
        assert len(fleet.kcat.read_keys(self.request_topic)) == REQUESTS  # nothing released or re-published
        assert fleet.kcat.read_keys(fleet.topic(channels.dead_letter_channel())) == []
        replies = reply_count(fleet)
        print(f"\n{REQUESTS} requests in {elapsed:.1f} s; killed after {answered_at_kill}; "
              f"{replies} replies on the reply topic ({replies - REQUESTS} computed twice)")
        assert replies >= REQUESTS


CRASHES: dict[str, type[RedisCrash] | type[KafkaCrash]] = {"redis": RedisCrash, "redis-cluster": RedisCrash, "kafka": KafkaCrash}


@pytest.mark.parametrize("broker", FLEET_BROKERS)
def test_a_worker_killed_mid_run_loses_and_repeats_no_answer(request: pytest.FixtureRequest, broker: str,
                                                              tmp_path: Path):
    repo = tmp_path / "repo"
    write_slow_add_sub(repo, SLOW_S)
    kind = CRASHES[broker]
    with open_fleet(request, broker, repo, tmp_path, kind.kafka_query) as fleet:
        crash = kind(fleet)  # type: ignore[arg-type]
        gateway = fleet.gateway()
        crash.workers = {worker_id: fleet.worker(worker_id, *crash.options) for worker_id in ("w1", "w2")}
        fleet.wait_model_ready(gateway, MODEL)

        clients = Clients(gateway.url)
        answered_at_kill, killed, elapsed = run_with_a_kill(clients, gateway, crash.kill, crash.restart)

        assert_each_answered_once_and_right(clients, answered_at_kill, fleet)
        crash.assert_nothing_lost(killed, answered_at_kill, elapsed)  # type: ignore[arg-type]
        assert gateway.errors() == [], gateway.describe()
        assert elapsed < crash.budget_s, f"{REQUESTS} requests took {elapsed:.1f} s"


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


def reply_count(fleet: KafkaFleet) -> int:
    """Replies on the gateway's reply topic: more than the requests when the
    killed worker replied to some it had not yet committed."""
    [topic] = [name for name in fleet.kcat.topics() if name.startswith(fleet.topic(channels.reply_channel("")))]
    return len(fleet.kcat.read_keys(topic))
