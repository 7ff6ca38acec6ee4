"""An outside client with no ferry code: kcat puts V2 JSON requests (or
envelopes) with headers on a model's request topic, and reads the replies
from the topic it named in ``reply-to``, keyed and headed as docs/producers.md says."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from broker import channels
from broker.envelope import Request, WireTensor, decode_response, encode_request
from tests.kafka_fleet.processes import FerryProcess, KafkaFleet, Record, wait_for

MODEL = "add_sub"
JSON_HEADERS = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def fleet(add_sub_fleet: KafkaFleet) -> KafkaFleet:
    return add_sub_fleet


@pytest.fixture(scope="module")
def worker(add_sub_worker: FerryProcess) -> FerryProcess:
    return add_sub_worker


def inputs(index: int) -> tuple[list[float], list[float]]:
    return [float(index * 16 + i) for i in range(16)], [float(i) * 0.5 - index for i in range(16)]


def v2_body(index: int, **extra: object) -> bytes:
    a, b = inputs(index)
    return json.dumps({
        "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": a},
                   {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": b}],
        **extra,
    }).encode()


def request_topic(fleet: KafkaFleet) -> str:
    return fleet.topic(channels.request_channel(MODEL))


def assert_add_sub_reply(record: Record, request_id: str, index: int) -> None:
    assert record.key == request_id, record
    assert record.headers.get("content-type") == "application/json", record.headers
    assert record.headers.get("request-id") == request_id, record.headers
    assert record.headers.get("model") == MODEL, record.headers
    assert "error" not in record.headers, record
    body = record.json()
    assert isinstance(body, dict)
    assert body["id"] == request_id and body["model_name"] == MODEL, body
    outputs = {output["name"]: output for output in body["outputs"]}
    a, b = inputs(index)
    assert outputs["OUTPUT0"]["data"] == [x + y for x, y in zip(a, b, strict=True)], outputs
    assert outputs["OUTPUT1"]["data"] == [x - y for x, y in zip(a, b, strict=True)], outputs
    assert outputs["OUTPUT0"]["shape"] == [1, 16] and outputs["OUTPUT0"]["datatype"] == "FP32"


def test_a_json_request_keyed_by_its_id_gets_a_v2_reply_keyed_and_headed(fleet: KafkaFleet, worker: FerryProcess):
    replies = "kcat.replies.keyed"
    fleet.kcat.produce(request_topic(fleet), v2_body(1), key="req-1", headers={**JSON_HEADERS, "reply-to": replies})
    [reply] = fleet.kcat.consume(fleet.topic(replies), 1)
    assert_add_sub_reply(reply, "req-1", 1)
    assert worker.running(), worker.describe()


def test_a_request_id_header_names_a_request_without_a_key(fleet: KafkaFleet):
    replies = "kcat.replies.header-id"
    fleet.kcat.produce(request_topic(fleet), v2_body(2, id="body-id"),
                       headers={**JSON_HEADERS, "reply-to": replies, "request-id": "hdr-2"})
    [reply] = fleet.kcat.consume(fleet.topic(replies), 1)
    assert_add_sub_reply(reply, "hdr-2", 2)


def test_without_key_or_header_the_body_id_names_the_request(fleet: KafkaFleet):
    replies = "kcat.replies.body-id"
    fleet.kcat.produce(request_topic(fleet), v2_body(3, id="body-3"), headers={**JSON_HEADERS, "reply-to": replies})
    [reply] = fleet.kcat.consume(fleet.topic(replies), 1)
    assert_add_sub_reply(reply, "body-3", 3)


def test_a_msgpack_envelope_without_content_type_gets_an_envelope_reply(fleet: KafkaFleet, worker: FerryProcess):
    replies = "kcat.replies.envelope"
    a, b = (np.array(values, dtype="<f4").reshape(1, 16) for values in inputs(4))
    request = Request(id="env-4", model=MODEL, reply_to=replies, inputs=(
        WireTensor("INPUT0", "FP32", (1, 16), a.tobytes()), WireTensor("INPUT1", "FP32", (1, 16), b.tobytes()),
    ))
    fleet.kcat.produce(request_topic(fleet), encode_request(request), key="env-4")
    wait_for(lambda: bool(fleet.kcat.read_keys(fleet.topic(replies))), 30.0, "the envelope reply", worker)
    [reply] = fleet.kcat.read_headed(fleet.topic(replies))
    assert reply.key == "env-4" and reply.headers.get("content-type") == "application/x-msgpack", reply
    response = decode_response(fleet.kcat.read_values(fleet.topic(replies)))
    assert response.id == "env-4" and response.error is None, response
    outputs = {t.name: np.frombuffer(t.data, dtype="<f4").reshape(t.shape) for t in response.outputs}
    assert np.array_equal(outputs["OUTPUT0"], a + b) and np.array_equal(outputs["OUTPUT1"], a - b)


def test_requests_keyed_by_sequence_id_share_a_partition_and_are_all_answered(fleet: KafkaFleet):
    replies = "kcat.replies.sequences"
    topic = request_topic(fleet)
    sent = {}
    sequences = ("seq-a", "seq-b", "seq-c")
    for sequence in sequences:
        for step in range(4):
            index = 10 + len(sent)
            request_id = f"{sequence}-{step}"
            sent[request_id] = index
            fleet.kcat.produce(topic, v2_body(index), key=sequence,
                               headers={**JSON_HEADERS, "reply-to": replies, "request-id": request_id})
    records = [(partition, key) for partition, key in fleet.kcat.read_keys(topic) if key in sequences]
    assert fleet.kcat.partitions(topic) == 4  # ferry's default, so one partition for all would show
    partitions: dict[str, set[int]] = defaultdict(set)
    for partition, key in records:
        partitions[key].add(partition)
    assert len(records) == len(sent) and all(len(found) == 1 for found in partitions.values()), partitions

    answered = fleet.kcat.consume(fleet.topic(replies), len(sent))
    assert sorted(record.key or "" for record in answered) == sorted(sent)
    for record in answered:
        assert_add_sub_reply(record, record.key or "", sent[record.key or ""])
