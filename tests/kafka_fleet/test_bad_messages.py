"""Bad messages on a request topic, from kcat: each gets an error reply when
its reply-to can be read, and goes to the dead-letter topic otherwise; the
worker keeps consuming, and a good request after them all is answered."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest

from broker import channels
from tests.kafka_fleet.processes import FerryProcess, KafkaFleet, Record, wait_for

MODEL = "add_sub"
REQUESTS = channels.request_channel(MODEL)
GARBAGE = b"\x00\xc1\xffnot json, not msgpack{"
SETTLE_S = 30.0


@pytest.fixture(scope="module")
def fleet(add_sub_fleet: KafkaFleet) -> KafkaFleet:
    return add_sub_fleet


@pytest.fixture(scope="module")
def worker(add_sub_worker: FerryProcess) -> FerryProcess:
    return add_sub_worker


def body(shape: tuple[int, int] = (1, 16)) -> bytes:
    count = shape[0] * shape[1]
    return json.dumps({
        "inputs": [{"name": "INPUT0", "shape": list(shape), "datatype": "FP32", "data": [1.0] * count},
                   {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [2.0] * 16}],
    }).encode()


def send(fleet: KafkaFleet, payload: bytes, key: str | None = None, **headers: str) -> None:
    fleet.kcat.produce(fleet.topic(REQUESTS), payload, key=key,
                       headers={name.replace("_", "-"): value for name, value in headers.items()})


def only_reply(fleet: KafkaFleet, replies: str) -> Record:
    [reply] = fleet.kcat.consume(fleet.topic(replies), 1, SETTLE_S)
    return reply


def assert_error_reply(reply: Record, request_id: str, code: str, *words: str) -> str:
    assert reply.headers.get("error") == code, reply
    assert reply.key == request_id and reply.headers.get("request-id") == request_id, reply
    assert reply.headers.get("content-type") == "application/json", reply
    decoded = reply.json()
    assert isinstance(decoded, dict) and set(decoded) == {"error"}, decoded
    message = str(decoded["error"])
    for word in words:
        assert word in message, message
    return message


def dead_letter_of(fleet: KafkaFleet, payload: bytes) -> dict[str, Any]:
    """The dead letter carrying ``payload``, waiting for it to appear."""
    found: list[dict[str, Any]] = []

    def arrived() -> bool:
        letters = fleet.kcat.read_msgpack(fleet.topic(channels.dead_letter_channel()))
        found[:] = [letter for letter in letters if isinstance(letter, dict) and letter.get("payload") == payload]
        return bool(found)

    wait_for(arrived, SETTLE_S, "a dead letter", fleet.processes[0], interval_s=0.2)
    [letter] = found
    assert letter["kind"] == "dead_letter" and letter["v"] == 1, letter
    assert letter["channel"] == REQUESTS and letter["attempts"] >= 1, letter
    return letter


def test_json_that_does_not_parse_gets_an_invalid_argument_reply(fleet: KafkaFleet):
    send(fleet, GARBAGE, key="bad-json", content_type="application/json", reply_to="bad.replies.json")
    assert_error_reply(only_reply(fleet, "bad.replies.json"), "bad-json", "invalid_argument", "malformed")


def test_an_unknown_content_type_gets_an_invalid_argument_reply(fleet: KafkaFleet):
    send(fleet, body(), key="bad-type", content_type="text/plain", reply_to="bad.replies.type")
    assert_error_reply(only_reply(fleet, "bad.replies.type"), "bad-type", "invalid_argument", "text/plain")


def test_bytes_without_headers_are_dead_lettered(fleet: KafkaFleet):
    payload = GARBAGE + b"no-headers"
    send(fleet, payload, key="bad-bare")
    letter = dead_letter_of(fleet, payload)
    assert letter["reason"], letter


def test_msgpack_that_is_no_envelope_is_dead_lettered(fleet: KafkaFleet):
    payload = msgpack.packb({"hello": "world"})
    send(fleet, payload, content_type="application/x-msgpack")
    assert dead_letter_of(fleet, payload)["reason"]


def test_an_unknown_model_gets_a_not_found_reply(fleet: KafkaFleet):
    send(fleet, body(), key="bad-model", content_type="application/json", reply_to="bad.replies.model",
         model="no_such_model")
    assert_error_reply(only_reply(fleet, "bad.replies.model"), "bad-model", "not_found", "no_such_model")


def test_json_without_reply_to_is_dead_lettered_with_the_reason(fleet: KafkaFleet):
    payload = body()[:-1] + b', "id": "no-reply-to"}'
    send(fleet, payload, key="bad-no-reply", content_type="application/json")
    letter = dead_letter_of(fleet, payload)
    assert "reply-to" in letter["reason"], letter


def test_a_wrong_tensor_shape_gets_an_invalid_argument_reply_naming_the_tensor(fleet: KafkaFleet):
    send(fleet, body(shape=(1, 8)), key="bad-shape", content_type="application/json", reply_to="bad.replies.shape")
    assert_error_reply(only_reply(fleet, "bad.replies.shape"), "bad-shape", "invalid_argument", "INPUT0")


def test_after_the_bad_messages_the_worker_still_answers_a_good_one(fleet: KafkaFleet, worker: FerryProcess):
    send(fleet, body(), key="good-1", content_type="application/json", reply_to="bad.replies.good")
    reply = only_reply(fleet, "bad.replies.good")
    assert "error" not in reply.headers and reply.key == "good-1", reply
    decoded = reply.json()
    assert isinstance(decoded, dict)
    outputs = {output["name"]: output["data"] for output in decoded["outputs"]}
    assert outputs == {"OUTPUT0": [3.0] * 16, "OUTPUT1": [-1.0] * 16}, outputs
    assert worker.running(), worker.describe()
    bad = [event for event in worker.log_events() if event.get("event") == "worker.bad_message"]
    assert len(bad) >= 5, worker.describe()
    assert worker.errors() == [], worker.describe()
