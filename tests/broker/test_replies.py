"""A reply router takes back replies its group holds pending but it never
handled: at start, and after its connection to the broker failed."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from broker import channels
from broker.envelope import Response, encode_response
from broker.replies import ReplyRouter
from broker.transports.memory import MemoryTransport
from broker.transports.redis import PAYLOAD_FIELD, RedisTransport
from tests.redis_server import flushdb

OWNER = "gw-test"


async def test_a_reply_delivered_before_the_router_started_is_handled():
    transport = MemoryTransport()
    channel, group = channels.reply_channel(OWNER), channels.reply_group(OWNER)
    await transport.publish(channel, encode_response(Response(id="r1", model="m")))
    # Delivered to this owner (a read whose answer was lost), never acked.
    (lost,) = await transport.fetch(channel, group, OWNER, 10, 0.0)
    router = ReplyRouter(transport, OWNER, poll_timeout_s=0.05)
    waiting = router.expect("r1")
    await router.start()
    try:
        async with asyncio.timeout(5):
            assert (await waiting).id == "r1"
        assert await transport.backlog(channel, group) == (0, 0)
    finally:
        await router.aclose()
        await transport.aclose()


async def test_a_reply_read_but_lost_with_the_connection_is_handled_after_reconnecting(redis_url: str):
    flushdb(redis_url)
    channel, group = channels.reply_channel(OWNER), channels.reply_group(OWNER)
    transport = RedisTransport(redis_url)
    router = ReplyRouter(transport, OWNER, poll_timeout_s=0.2)
    raw = aioredis.Redis.from_url(redis_url, protocol=2)
    await router.start()
    try:
        waiting = router.expect("r1")
        async with asyncio.timeout(5):
            while not await raw.exists(channel):  # the router's group exists once it has read
                await asyncio.sleep(0.02)
        # Added and delivered to the router's consumer in one step, as Redis records a read
        # it answered just before it died: pending for the router, yet the router never saw it.
        async with raw.pipeline(transaction=True) as pipe:
            pipe.xadd(channel, {PAYLOAD_FIELD: encode_response(Response(id="r1", model="m"))})
            pipe.xreadgroup(group, OWNER, {channel: ">"}, count=10)
            _, read = await pipe.execute()
        assert read and len(read[0][1]) == 1
        await raw.client_kill_filter(_type="normal", skipme=True)  # the router's connections drop
        async with asyncio.timeout(10):
            assert (await waiting).id == "r1"
        async with asyncio.timeout(10):
            while (await raw.xpending(channel, group))["pending"]:
                await asyncio.sleep(0.05)
    finally:
        await router.aclose()
        await transport.aclose()
        await raw.aclose()
