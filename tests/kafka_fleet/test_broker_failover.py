"""One broker of three SIGKILLed under load (replication factor 3, ``min.insync.replicas`` 2, as
ferry creates its topics on three brokers): 1,000 requests produced by kcat and 1,000 sent
through the gateway, to two workers. Every request kcat's produce was acknowledged for is answered on
its reply topic, once; every HTTP request gets its own right answer or a clear error, none
waits out a timeout."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import httpx
import pytest

from broker import channels
from tests.broker.test_kafka_transport import topic_settings
from tests.kafka_cluster import KafkaCluster
from tests.kafka_fleet.processes import Gateway, KafkaFleet
from tests.kafka_fleet.test_broker_restart import assert_correct, body
from tests.models import write_slow_add_sub

MODEL = "add_sub"
EACH = 1_000
CLIENTS = 16
REPLIES = "failover.replies"
CLIENT_TIMEOUT_S = 60.0
RECOVER_S = 120.0
LOAD_DEADLINE_S = 240.0  # for every HTTP request to be answered or refused, after the kill
WORKER = ("--models", MODEL, "--heartbeat-s", "0.5")


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    with KafkaCluster() as started:
        yield started


class HttpLoad:
    def __init__(self, gateway: Gateway) -> None:
        self._url = f"http://{gateway.url}/v2/models/{MODEL}/infer"
        self.outcomes: dict[int, tuple[int, str]] = {}
        self.done = 0
        self._lock = threading.Lock()

    def send(self, client: httpx.Client, index: int) -> None:
        try:
            response = client.post(self._url, content=body(index), headers={"content-type": "application/json"})
        except httpx.TimeoutException:
            outcome = (0, "no answer within the client timeout")
        else:
            if response.status_code == 200:
                outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
                right = outputs == {"OUTPUT0": [index + 1.0] * 16, "OUTPUT1": [index - 1.0] * 16}
                outcome = (200, "right" if right else f"wrong: {outputs}")
            else:
                outcome = (response.status_code, response.text[:200])
        with self._lock:
            self.outcomes[index] = outcome
            self.done += 1


def test_a_broker_killed_under_load_loses_no_acknowledged_request_and_answers_none_twice(
    cluster: KafkaCluster, tmp_path: Path,
):
    repo = tmp_path / "repo"
    write_slow_add_sub(repo, 0.002)
    with KafkaFleet(cluster.bootstrap, repo, tmp_path) as fleet, \
            httpx.Client(timeout=CLIENT_TIMEOUT_S, limits=httpx.Limits(max_connections=CLIENTS + 4)) as client, \
            ThreadPoolExecutor(CLIENTS) as pool:
        gateway = fleet.gateway()
        workers = [fleet.worker(f"w{i}", *WORKER) for i in (1, 2)]
        fleet.wait_model_ready(gateway, MODEL)
        request_topic, replies = fleet.topic(channels.request_channel(MODEL)), fleet.topic(REPLIES)
        headers = {"content-type": "application/json", "reply-to": REPLIES}

        load = HttpLoad(gateway)
        calls = [pool.submit(load.send, client, EACH + index) for index in range(EACH)]
        fleet.kcat.produce_lines(request_topic, [(f"r-{i}", body(i)) for i in range(EACH // 2)], headers)
        while load.done < EACH // 3:
            time.sleep(0.05)
        cluster.kill(2)
        killed_at = time.monotonic()
        fleet.kcat.produce_lines(request_topic, [(f"r-{i}", body(i)) for i in range(EACH // 2, EACH)], headers)
        _, unfinished = wait(calls, timeout=LOAD_DEADLINE_S)
        if unfinished:
            pool.shutdown(cancel_futures=True)  # those not sent yet stay unsent; the rest time out
            raise AssertionError(f"{len(unfinished)} of {EACH} HTTP requests still unanswered "
                                 f"{LOAD_DEADLINE_S:g} s after the kill\n{fleet.describe()}")

        expected = {f"r-{i}" for i in range(EACH)}
        deadline = time.monotonic() + RECOVER_S
        while {key for _, key in fleet.kcat.read_keys(replies)} < expected and time.monotonic() < deadline:
            time.sleep(0.5)
        records = fleet.kcat.read(replies)
        finished_s = time.monotonic() - killed_at
        assert all(worker.running() for worker in workers) and gateway.running(), fleet.describe()
        live = ",".join(f"127.0.0.1:{port}" for port in cluster.ports[2:] + cluster.ports[:1])
        assert topic_settings(live, request_topic) == (3, "2")  # as ferry created it
        error_lines = {process.name: len(process.errors()) for process in fleet.processes}

    answered = Counter(record.key for record in records)
    missing = sorted(expected - set(answered), key=lambda key: int(key.removeprefix("r-")))
    assert not missing, f"{len(missing)} acknowledged requests never answered: {missing[:20]}"
    twice = {key: count for key, count in answered.items() if count > 1}
    assert not twice, f"{len(twice)} requests answered more than once on {REPLIES}: {list(twice.items())[:20]}"
    for record in records:
        assert_correct(record)
    hung = {i: o for i, o in load.outcomes.items() if o[0] == 0}
    assert not hung, f"{len(hung)} HTTP requests had no answer within {CLIENT_TIMEOUT_S:g} s"
    bad = {i: o for i, o in load.outcomes.items() if (o[0] == 200 and o[1] != "right") or o[0] not in (200, 503, 504)}
    assert not bad, f"HTTP answers neither right nor a clear error: {dict(list(bad.items())[:10])}"
    statuses = Counter(status for status, _ in load.outcomes.values())
    refusals = Counter(text[:100] for status, text in load.outcomes.values() if status != 200)
    print(f"\nkcat: {EACH} answered once each; HTTP: {dict(statuses)} by status; "
          f"all done {finished_s:.1f} s after the kill")
    print(f"refusals: {json.dumps(refusals.most_common(5))}")
    print(f"error lines logged: {json.dumps(error_lines)}")
