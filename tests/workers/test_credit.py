"""A model's credit: how many deliveries a worker takes to compute, and how many it holds
while their replies are on their way (``workers.worker.credit``)."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from broker import channels
from broker.claims.check import ClaimCheck, ClaimSettings
from broker.claims.redis_store import RedisClaims
from broker.envelope import decode_response, encode_request
from broker.transport import Delivery
from tests.workers.test_worker import next_messages
from tests.workers.test_worker_policy import REPLIES, computed, recording_config, request, started
from workers.worker.credit import InFlight


def deliveries(first: int, count: int) -> list[Delivery]:
    return [Delivery("c", "g", f"0-{n}", b"") for n in range(first, first + count)]


async def test_a_computed_delivery_makes_room_while_its_reply_is_on_its_way_up_to_the_ceiling():
    replies_sent = asyncio.Event()

    async def handle(model: str, delivery: Delivery, computed) -> None:
        computed()
        await replies_sent.wait()  # the reply, on its way to the broker

    in_flight = InFlight(handle, retry_after_s=30)
    credit = in_flight.size("m", 2, 5)
    assert in_flight.dispatch("m", deliveries(0, 2)) == 2
    assert credit.room == 0  # both computing (their handlers have not run yet)
    await asyncio.sleep(0)
    assert (credit.room, credit.used) == (2, 2)  # computed, replies outstanding
    in_flight.dispatch("m", deliveries(2, 2))
    await asyncio.sleep(0)
    assert (credit.room, credit.used) == (1, 4)  # the ceiling, not the limit, binds now
    in_flight.dispatch("m", deliveries(4, 1))
    await asyncio.sleep(0)
    assert credit.room == 0
    replies_sent.set()
    await in_flight.join()
    await asyncio.sleep(0)
    assert (credit.room, credit.used, credit.computing) == (2, 0, 0)


async def test_a_delivery_still_computing_or_failed_before_it_holds_or_frees_its_credit():
    release = asyncio.Event()

    async def handle(model: str, delivery: Delivery, computed) -> None:
        if delivery.message_id == "0-0":
            await release.wait()  # a long batch
            computed()
        else:
            raise RuntimeError("handler failed before its response was computed")

    in_flight = InFlight(handle, retry_after_s=30)
    credit = in_flight.size("m", 2, 512)
    in_flight.dispatch("m", deliveries(0, 2))
    await asyncio.sleep(0.01)
    assert (credit.room, credit.used, credit.computing) == (1, 1, 1)
    release.set()
    await in_flight.join()
    await asyncio.sleep(0)
    assert (credit.room, credit.used, credit.computing) == (2, 0, 0)


async def test_a_worker_computes_the_next_request_while_a_reply_waits_on_the_broker(tmp_path, redis_url):
    """One request in compute at a time (one instance, one row, ``--prefetch 1``); the replies'
    outputs are claim-checked (every tensor, here) into Redis, which is paused: the replies wait,
    and the worker goes on taking and computing requests meanwhile instead of waiting with them."""
    log = tmp_path / "log"
    claims = ClaimCheck(RedisClaims(redis_url, prefix=f"credit-{tmp_path.name}."), ClaimSettings(threshold_bytes=1))
    transport, worker = await started(tmp_path, recording_config(log), prefetch=1, claims=claims)
    admin = aioredis.from_url(redis_url)
    try:
        await transport.publish(channels.request_channel("rec"), encode_request(request(1, claim_owner="test")))
        await next_messages(transport, REPLIES, 1)
        await admin.execute_command("CLIENT", "PAUSE", "2500", "ALL")
        for value in (2, 3, 4):
            await transport.publish(channels.request_channel("rec"), encode_request(request(value, claim_owner="test")))
        await asyncio.sleep(1.0)
        assert computed(log) == [1, 2, 3, 4], "computed while Redis was paused"
        unread, _ = await transport.backlog(REPLIES, "reader")
        assert unread == 0  # every reply still waiting on Redis
        replies = [decode_response(raw) for raw in await next_messages(transport, REPLIES, 3)]
        assert sorted(reply.id for reply in replies) == ["r2", "r3", "r4"]
        assert all(reply.error is None for reply in replies)
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
        await admin.aclose()
        await worker.aclose()
        await claims.aclose()
        await transport.aclose()
