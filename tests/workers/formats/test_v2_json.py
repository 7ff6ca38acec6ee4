"""V2 JSON request messages put straight onto a request channel, as an
external producer would, answered by a worker in JSON."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import orjson
import pytest

from broker import channels
from broker.envelope import decode_response, encode_request
from broker.transport import Delivery
from broker.transports.memory import MemoryTransport
from workers.formats.v2_json import V2MessageFormat
from tests.workers.test_worker import add_sub_request
from workers.repository.layout import ModelRepository
from workers.worker import Worker, WorkerSettings

MODEL_REPO = Path(__file__).resolve().parents[3] / "model_repo"
REQUESTS = channels.request_channel("add_sub")
JSON = (("content-type", b"application/json"),)


@pytest.fixture
async def transport(tmp_path: Path) -> AsyncIterator[MemoryTransport]:
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    async with MemoryTransport() as transport:
        settings = WorkerSettings(worker_id="w1", poll_timeout_s=0.05)
        async with Worker(transport, ModelRepository(tmp_path), settings, message_format=V2MessageFormat()):
            yield transport


def body(rows: int = 1, datatype: str = "FP32", **extra: object) -> bytes:
    return orjson.dumps({
        "id": "from-body",
        "inputs": [{"name": "INPUT0", "shape": [rows, 16], "datatype": datatype, "data": list(range(16 * rows))},
                   {"name": "INPUT1", "shape": [rows, 16], "datatype": datatype, "data": [1] * 16 * rows}],
        **extra,
    })


async def reply(transport: MemoryTransport, channel: str = "my.replies") -> Delivery:
    (delivery,) = await transport.fetch(channel, "client", "c", 1, 5)
    return delivery


async def test_a_json_request_gets_a_json_reply_keyed_by_its_id(transport):
    headers = (*JSON, ("reply-to", b"my.replies"), ("request-id", b"r-1"))
    await transport.publish(REQUESTS, body(), headers=headers)
    answer = await reply(transport)
    assert answer.header("content-type") == b"application/json"
    assert answer.header("request-id") == b"r-1" and answer.header("error") is None
    decoded = orjson.loads(answer.payload)
    assert decoded["id"] == "r-1" and decoded["model_name"] == "add_sub"
    outputs = {o["name"]: o["data"] for o in decoded["outputs"]}
    assert outputs["OUTPUT0"] == [v + 1 for v in range(16)]


async def test_the_kafka_key_then_the_body_id_stand_in_for_a_request_id(transport):
    await transport.publish(REQUESTS, body(), headers=(*JSON, ("reply-to", b"my.replies"), ("kafka-key", b"k-9")))
    assert (await reply(transport)).header("request-id") == b"k-9"
    await transport.publish(REQUESTS, body(), headers=(*JSON, ("reply-to", b"my.replies")))
    assert (await reply(transport)).header("request-id") == b"from-body"


@pytest.mark.parametrize(("payload", "headers", "code", "fragment"), [
    (b"{not json", (), "invalid_argument", "malformed request"),
    (body(datatype="INT32"), (), "invalid_argument", "INPUT0"),
    (body(), (("model", b"nope"),), "not_found", "nope"),
    (body(), (("deadline-ms", b"soon"),), "invalid_argument", "deadline-ms"),
    (body(), (("deadline-ms", b"1000"),), "timeout", "timed out"),
    (body(), (("deadline-ms", "\u00b2".encode()),), "invalid_argument", "deadline-ms"),
    (body(), (("deadline-ms", b"9" * 40),), "invalid_argument", "deadline-ms"),
    (body(), (("model-version", "\uff11".encode()),), "not_found", "version"),
    (body(parameters={f"p{i}": i for i in range(65)}), (), "invalid_argument", "parameters"),
], ids=["not-json", "wrong-datatype", "unknown-model", "bad-deadline", "expired", "superscript-deadline",
        "deadline-past-int64", "fullwidth-version", "65-parameters"])
async def test_a_bad_json_request_gets_an_error_header_and_a_json_error_body(transport, payload, headers, code, fragment):
    await transport.publish(REQUESTS, payload, headers=(*JSON, ("reply-to", b"my.replies"), ("request-id", b"b"),
                                                        *headers))
    answer = await reply(transport)
    assert answer.header("error") == code.encode()
    assert fragment in orjson.loads(answer.payload)["error"]


async def test_without_a_reply_to_a_json_request_is_dead_lettered(transport):
    await transport.publish(REQUESTS, body(), headers=JSON)
    await transport.publish(REQUESTS, b"x", headers=(("content-type", b"text/plain"), ("reply-to", b"my.replies")))
    letter = msgpack.unpackb((await reply(transport, channels.dead_letter_channel())).payload)
    assert "reply-to" in letter["reason"]
    answer = await reply(transport)
    assert answer.header("error") == b"invalid_argument" and b"content-type" in answer.payload


async def test_an_envelope_is_still_answered_with_an_envelope(transport):
    await transport.publish(REQUESTS, encode_request(add_sub_request("env-1")))
    (raw,) = await transport.fetch("ferry.replies.test", "client", "c", 1, 5)
    assert raw.header("content-type") == b"application/x-msgpack"
    assert decode_response(raw.payload).id == "env-1"
