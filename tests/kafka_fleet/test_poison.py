"""Poison over Kafka. A request the model fails on is re-published with
``ferry-attempts`` one higher, so any worker of the group may retry it; one
that kills its worker is counted through the marks committed with the
offsets. Either way, after ``--max-deliveries`` it lands on the dead-letter
topic with the reason and the original bytes, and its sender gets the error;
the requests beside it are answered as usual."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from broker import channels
from tests.fleet.test_poison import (
    CRASH_DELIVERIES, CRASH_OPTIONS, GOOD_VALUES, MAX_DELIVERIES, MODEL, POISON, RETRYING,
    assert_poison_failed_max_deliveries_times, assert_poison_letter, infer_poison_among_good, repository,
)  # fmt: skip
from tests.kafka_fleet.processes import KafkaFleet
from tests.models import recorded_values


@pytest.mark.parametrize("workers", [1, 2], ids=["one-worker", "two-workers"])
def test_a_request_the_model_fails_on_goes_to_the_dead_letter_topic_after_max_deliveries(
    kafka_bootstrap: str, tmp_path: Path, workers: int,
):
    record = tmp_path / "computed.txt"
    with KafkaFleet(kafka_bootstrap, repository(tmp_path, record), tmp_path) as fleet:
        gateway = fleet.gateway()
        started = [fleet.worker(f"w{index}", *RETRYING) for index in range(workers)]
        fleet.wait_model_ready(gateway, MODEL)
        # Each computation is counted below: none may be sent while partitions still move.
        fleet.wait_assigned(started, channels.request_channel(MODEL))

        error, answers = infer_poison_among_good(gateway)

        assert_poison_failed_max_deliveries_times(error, answers, record, fleet)
        [letter] = fleet.kcat.read_msgpack(fleet.topic(channels.dead_letter_channel()))
        request = assert_poison_letter(letter)
        # The first delivery and each re-publication are on the request topic: MAX_DELIVERIES copies in all.
        on_topic = fleet.kcat.read_msgpack(fleet.topic(channels.request_channel(MODEL)))
        ids = [envelope["id"] for envelope in on_topic if isinstance(envelope, dict)]
        assert ids.count(request.id) == MAX_DELIVERIES and len(ids) == MAX_DELIVERIES + len(GOOD_VALUES), ids


# --- a model that kills its worker --------------------------------------------

CRASH_REPLIES = "poison.replies"
# The broker's floor (group.min.session.timeout.ms): a dead worker's partitions move after this.
CRASH_SESSION = "session_timeout_ms=6000&heartbeat_interval_ms=500"
CRASH_BUDGET_S = 90.0


def v2_body(value: int) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [value]}]}).encode()


def produce(fleet: KafkaFleet, value: int, request_id: str) -> None:
    fleet.kcat.produce(fleet.topic(channels.request_channel(MODEL)), v2_body(value), key=request_id,
                       headers={"content-type": "application/json", "reply-to": CRASH_REPLIES})


def test_a_request_that_kills_every_worker_is_counted_through_commits_and_dead_lettered(
    kafka_bootstrap: str, tmp_path: Path,
):
    """Kafka counts no deliveries; the marks ferry commits with its offsets do
    (``broker/transports/kafka_marks``). Each worker that takes the poison
    dies; the test starts another, as a supervisor would, once the last has
    died. Deliveries 1..N kill a worker each; delivery N+1 is past the limit,
    so it is dead-lettered unseen by the model and its sender gets an error."""
    record = tmp_path / "computed.txt"
    with KafkaFleet(kafka_bootstrap, repository(tmp_path, record, on_poison="exit"), tmp_path, CRASH_SESSION) as fleet:
        workers = [fleet.worker("w0", *CRASH_OPTIONS)]
        produce(fleet, POISON, "poison-1")
        replies = fleet.topic(CRASH_REPLIES)
        started = time.monotonic()
        while not fleet.kcat.read_keys(replies):
            assert time.monotonic() - started < CRASH_BUDGET_S, f"no answer yet\n{fleet.describe()}"
            if not workers[-1].running():
                assert len(workers) <= CRASH_DELIVERIES, f"{len(workers)} workers died\n{fleet.describe()}"
                # Not waiting for its heartbeat: it may take the poison and die first.
                workers.append(fleet.worker(f"w{len(workers)}", *CRASH_OPTIONS, wait=False))
            time.sleep(0.1)

        [reply] = fleet.kcat.read(replies)
        assert reply.key == "poison-1" and reply.headers.get("error") == "unavailable", reply
        message = str(reply.json()["error"])  # type: ignore[index]
        assert "dead-letter" in message and "without completing" in message, message
        assert [worker.process.returncode for worker in workers[:-1]] == [1] * CRASH_DELIVERIES, fleet.describe()
        assert recorded_values(record) == [POISON] * CRASH_DELIVERIES, fleet.describe()
        [letter] = fleet.kcat.read_msgpack(fleet.topic(channels.dead_letter_channel()))
        assert isinstance(letter, dict) and letter["attempts"] == CRASH_DELIVERIES + 1, letter
        # The survivor still serves, and counts the next request once.
        produce(fleet, GOOD_VALUES[0], "good-1")
        [_, good] = fleet.kcat.consume(replies, 2)
        assert good.key == "good-1" and "error" not in good.headers, good
        assert workers[-1].running(), workers[-1].describe()
        assert recorded_values(record) == [POISON] * CRASH_DELIVERIES + [GOOD_VALUES[0]]
