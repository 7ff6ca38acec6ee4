"""The Kafka broker stopped and restarted mid-run: the worker and the gateway
reconnect by themselves, and no request the broker acknowledged is lost."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from broker import channels
from tests.kafka_fleet.processes import Gateway, KafkaFleet, Record
from tests.kafka_server import KafkaServer
from tests.models import write_slow_add_sub

MODEL = "add_sub"
# Slow enough that the first requests are still being computed when the broker goes down.
SLOW_S = 0.5
EACH_SIDE = 40
DOWN_S = 2.0
REPLIES = "restart.replies"
RECOVER_S = 90.0
HTTP_RECOVER_S = 60.0


def body(index: int) -> bytes:
    return json.dumps({
        "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [float(index)] * 16},
                   {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}],
    }).encode()


def produce(fleet: KafkaFleet, indices: range) -> None:
    """All at once, returning once the broker has acknowledged every one."""
    fleet.kcat.produce_lines(fleet.topic(channels.request_channel(MODEL)),
                             [(f"r-{index}", body(index)) for index in indices],
                             {"content-type": "application/json", "reply-to": REPLIES})


def assert_correct(record: Record) -> None:
    index = int((record.key or "").removeprefix("r-"))
    assert "error" not in record.headers, record
    decoded = record.json()
    assert isinstance(decoded, dict) and decoded["id"] == record.key, decoded
    outputs = {output["name"]: output["data"] for output in decoded["outputs"]}
    assert outputs == {"OUTPUT0": [index + 1.0] * 16, "OUTPUT1": [index - 1.0] * 16}, (record.key, outputs)


def infer_over_http(gateway: Gateway, deadline_s: float) -> tuple[float, list[str]]:
    """Retry a synchronous infer until it answers 200; (seconds it took, the failures before)."""
    request_body = body(1000)
    started = time.monotonic()
    failures: list[str] = []
    while time.monotonic() - started < deadline_s:
        request = urllib.request.Request(f"http://{gateway.url}/v2/models/{MODEL}/infer", data=request_body,
                                         headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                decoded = json.loads(response.read())
                outputs = {output["name"]: output["data"] for output in decoded["outputs"]}
                assert outputs["OUTPUT0"] == [1001.0] * 16, outputs
                return time.monotonic() - started, failures
        except urllib.error.HTTPError as exc:
            failures.append(f"{exc.code} {exc.read()[:200]!r}")
        except OSError as exc:  # a client-side timeout: the reply never came
            failures.append(repr(exc))
        time.sleep(0.5)
    raise AssertionError(f"no 200 from the gateway within {deadline_s} s after the restart: {failures[-5:]}")


def test_after_a_broker_restart_every_acked_request_is_answered_and_http_serves_again(
    kafka_server: KafkaServer, tmp_path: Path,
):
    repo = tmp_path / "repo"
    write_slow_add_sub(repo, SLOW_S)
    with KafkaFleet(kafka_server.bootstrap, repo, tmp_path) as fleet:
        gateway = fleet.gateway()
        worker = fleet.worker("w1", "--models", MODEL, "--heartbeat-s", "0.5")
        fleet.wait_model_ready(gateway, MODEL)
        pids = {process.name: process.pid for process in fleet.processes}
        replies = fleet.topic(REPLIES)

        produce(fleet, range(EACH_SIDE))
        answered_before = len(fleet.kcat.read_keys(replies))
        kafka_server.restart(down_s=DOWN_S)
        produce(fleet, range(EACH_SIDE, 2 * EACH_SIDE))

        expected = {f"r-{index}" for index in range(2 * EACH_SIDE)}
        try:
            waited = wait_answered(fleet, replies, expected)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{fleet.describe()}") from None
        records = fleet.kcat.read(replies)
        for record in records:
            assert_correct(record)
        took_s, failures = infer_over_http(gateway, HTTP_RECOVER_S)
        print(f"\n{answered_before} of {EACH_SIDE} answered before the restart; all {2 * EACH_SIDE} answered "
              f"{waited:.1f} s after it ({len(records) - len(expected)} twice); HTTP 200 after {took_s:.1f} s, "
              f"failures before: {failures}")
        assert answered_before < EACH_SIDE, "the restart came after the work was done; slow the model down"
        for process in fleet.processes:
            print(f"{process.name}: {len(process.errors())} error lines", *process.errors()[:3], sep="\n  ")
        assert worker.running() and gateway.running(), fleet.describe()
        assert {process.name: process.pid for process in fleet.processes} == pids


def wait_answered(fleet: KafkaFleet, replies: str, expected: set[str]) -> float:
    started = time.monotonic()
    seen: set[str] = set()
    while time.monotonic() - started < RECOVER_S:
        seen = {key for _, key in fleet.kcat.read_keys(replies)}
        if seen >= expected:
            return time.monotonic() - started
        time.sleep(0.5)
    missing = sorted(expected - seen, key=lambda key: int(key.removeprefix("r-")))
    raise AssertionError(f"{len(missing)} acknowledged requests never answered within {RECOVER_S} s: {missing}")
