"""``SpeechSession`` against a real redis-server, the test answering each
chunk as a worker would: every reply comes back once, in order."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import numpy as np
import orjson
import redis.asyncio as aioredis

from broker import channels
from ferry.speech_client import SpeechSession

SESSION_CHANNEL = "ferry.speech.sessions.w1"


def reply_body(chunk: int) -> bytes:
    outputs = {"TEXT": f"chunk {chunk}", "IS_FINAL": False, "START_MS": 0, "END_MS": 0, "AUDIO_MS": 160 * (chunk + 1)}
    return orjson.dumps({"parameters": {"sequence_channel": SESSION_CHANNEL},
                         "outputs": [{"name": name, "data": [value]} for name, value in outputs.items()]})


async def answer(client: aioredis.Redis, streams: list[str], count: int) -> None:
    """Reply to ``count`` chunks on ``streams``, each a moment late: by then
    the session's own reads of its reply stream are all waiting."""
    last: dict[Any, Any] = dict.fromkeys(streams, "0")
    answered = 0
    while answered < count:
        found: Any = await client.xread(last, block=10_000)
        for stream, entries in found:
            for entry_id, fields in entries:
                last[stream.decode()] = entry_id.decode()
                await asyncio.sleep(0.2)
                chunk = int(fields[b"h.request-id"].decode().rsplit("-", 1)[-1])
                reply: dict[Any, Any] = {"d": reply_body(chunk), "h.request-id": fields[b"h.request-id"]}
                await client.xadd(fields[b"h.reply-to"], reply)
                answered += 1


async def test_each_reply_is_returned_once_while_chunks_are_still_being_sent(redis_url: str) -> None:
    model = f"speech-{uuid.uuid4().hex[:8]}"
    requests = channels.request_channel(model)
    client = aioredis.Redis.from_url(redis_url)
    try:
        async with SpeechSession(redis_url, model) as session:
            worker = asyncio.create_task(answer(client, [requests, SESSION_CHANNEL], 3))

            async def send_three() -> None:
                for index in range(3):
                    await session.send(np.zeros(160, np.int16), end=index == 2)

            sender = asyncio.create_task(send_three())  # as `ferry speech` does: reading while sending
            got = [(t.chunk, t.text) async for t in session.transcripts(timeout_s=10)]
            await sender
            await worker
            assert session.channel == SESSION_CHANNEL
    finally:
        await client.delete(requests, SESSION_CHANNEL)
        await client.aclose()
    assert got == [(n, f"chunk {n}") for n in range(3)]
