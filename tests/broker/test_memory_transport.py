import asyncio

import pytest

from broker.errors import TransportClosed
from broker.transports.memory import MemoryTransport


async def test_each_message_goes_to_one_member_of_a_group_and_to_every_group():
    transport = MemoryTransport()
    for n in range(4):
        await transport.publish("c", f"m{n}".encode())
    a = await transport.fetch("c", "g", "a", 2, 0)
    b = await transport.fetch("c", "g", "b", 10, 0)
    other = await transport.fetch("c", "h", "x", 10, 0)
    assert [d.payload for d in a] == [b"m0", b"m1"]
    assert [d.payload for d in b] == [b"m2", b"m3"]
    assert len(other) == 4


async def test_fetch_waits_for_a_publish_and_times_out_empty():
    transport = MemoryTransport()
    assert await transport.fetch("c", "g", "a", 1, 0.01) == []
    waiter = asyncio.create_task(transport.fetch("c", "g", "a", 1, 5))
    await asyncio.sleep(0)
    await transport.publish("c", b"hello")
    assert [d.payload for d in await waiter] == [b"hello"]


async def test_unacked_messages_stay_pending_and_can_be_claimed_after_idling():
    now = [0.0]
    transport = MemoryTransport(clock=lambda: now[0])
    await transport.publish("c", b"work")
    (delivery,) = await transport.fetch("c", "g", "dead-worker", 1, 0)
    assert transport.backlog("c", "g") == (0, 1)
    assert await transport.claim_stale("c", "g", "live", min_idle_s=5, max_count=10) == []
    now[0] = 6.0
    (claimed,) = await transport.claim_stale("c", "g", "live", min_idle_s=5, max_count=10)
    assert claimed.payload == b"work" and claimed.attempts == 2
    await transport.ack(claimed)
    assert transport.backlog("c", "g") == (0, 0)


async def test_messages_published_before_any_consumer_are_kept():
    transport = MemoryTransport()
    await transport.publish("c", b"early")
    assert [d.payload for d in await transport.fetch("c", "late-group", "a", 5, 0)] == [b"early"]


async def test_closed_transport_refuses_work_and_wakes_waiters():
    transport = MemoryTransport()
    waiter = asyncio.create_task(transport.fetch("c", "g", "a", 1, 5))
    await asyncio.sleep(0)
    await transport.aclose()
    with pytest.raises(TransportClosed):
        await waiter
    with pytest.raises(TransportClosed):
        await transport.publish("c", b"x")
