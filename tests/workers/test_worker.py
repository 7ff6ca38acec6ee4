"""The worker loop on the in-memory transport: replies, acks, bad messages."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import msgpack
import numpy as np
import pytest

from broker import channels
from broker.envelope import Request, WireTensor, decode_response, encode_request
from broker.transports.memory import MemoryTransport
from workers.repository.layout import ModelRepository
from workers.worker import Worker, WorkerSettings

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"
REQUESTS = channels.request_channel("add_sub")
GROUP = channels.worker_group("add_sub")
REPLIES = "ferry.replies.test"


@pytest.fixture
async def running(tmp_path: Path):
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    transport = MemoryTransport()
    worker = Worker(transport, ModelRepository(tmp_path), WorkerSettings(worker_id="w1", poll_timeout_s=0.05))
    await worker.start()
    yield transport
    await worker.aclose()
    await transport.aclose()


def add_sub_request(request_id: str, model: str = "add_sub", rows: int = 1) -> Request:
    a = np.arange(16 * rows, dtype=np.float32).reshape(rows, 16)
    return Request(
        id=request_id, model=model, reply_to=REPLIES,
        inputs=(WireTensor("INPUT0", "FP32", (rows, 16), a.tobytes()),
                WireTensor("INPUT1", "FP32", (rows, 16), np.ones_like(a).tobytes())),
    )


async def next_messages(transport: MemoryTransport, channel: str, count: int) -> list[bytes]:
    got: list[bytes] = []
    async with asyncio.timeout(10):
        while len(got) < count:
            got += [d.payload for d in await transport.fetch(channel, "reader", "r", count, 0.5)]
    return got


async def test_a_request_is_answered_and_acked_after_the_reply(running: MemoryTransport):
    await running.publish(REQUESTS, encode_request(add_sub_request("r1", rows=2)))
    (raw,) = await next_messages(running, REPLIES, 1)
    response = decode_response(raw)
    assert response.id == "r1" and response.error is None
    out = {t.name: np.frombuffer(t.data, np.float32).reshape(t.shape) for t in response.outputs}
    np.testing.assert_array_equal(out["OUTPUT0"], np.arange(32, dtype=np.float32).reshape(2, 16) + 1)
    await asyncio.sleep(0.05)
    assert await running.backlog(REQUESTS, GROUP) == (0, 0)


async def test_garbage_with_no_reply_channel_goes_to_the_dead_letter_channel(running: MemoryTransport):
    await running.publish(REQUESTS, b"\x93not an envelope")
    (raw,) = await next_messages(running, channels.dead_letter_channel(), 1)
    letter = msgpack.unpackb(raw)
    assert letter["payload"] == b"\x93not an envelope"
    assert letter["channel"] == REQUESTS and letter["reason"]
    await running.publish(REQUESTS, encode_request(add_sub_request("after")))
    (reply,) = await next_messages(running, REPLIES, 1)
    assert decode_response(reply).id == "after"


async def test_a_broken_envelope_with_a_reply_channel_gets_an_error_reply(running: MemoryTransport):
    broken = msgpack.packb({"v": 1, "kind": "request", "id": "b1", "model": "add_sub",
                           "reply_to": REPLIES, "inputs": "nope"})
    await running.publish(REQUESTS, broken)
    (raw,) = await next_messages(running, REPLIES, 1)
    response = decode_response(raw)
    assert response.id == "b1" and response.error.code == "invalid_argument"
    assert "inputs" in response.error.message


@pytest.mark.parametrize(("request_", "code", "fragment"), [
    (add_sub_request("u1", model="other"), "not_found", "other"),
    (Request(id="s1", model="add_sub", reply_to=REPLIES,
             inputs=(WireTensor("INPUT0", "FP32", (1, 8), b"\x00" * 32),)), "invalid_argument", "INPUT0"),
])
async def test_requests_the_model_cannot_take_get_error_replies(running, request_, code, fragment):
    await running.publish(REQUESTS, encode_request(request_))
    (raw,) = await next_messages(running, REPLIES, 1)
    response = decode_response(raw)
    assert response.error is not None and response.error.code == code
    assert fragment in response.error.message
