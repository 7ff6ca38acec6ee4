"""The behaviour every transport promises, run against each one."""

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

from broker.errors import TransportClosed, TransportError
from broker.transports import open_transport
from broker.transports.kafka import KafkaTransport
from broker.transports.memory import MemoryTransport
from broker.transports.redis import RedisTransport
from tests.brokers import BROKERS, broker_url
from tests.redis_server import RedisServer, flushdb, free_port

IDLE_S = 0.2
AnyTransport = MemoryTransport | RedisTransport | KafkaTransport
# Kafka hands work out by partition and takes it back by rebalance; where a
# test pins down Redis Streams' per-message pending list, it does not apply.
NO_CLAIMS_ON_KAFKA = (
    "Kafka has no per-message pending list shared across processes: claims reach only this "
    "process's members, and a dead member's partitions are re-read from the committed offset "
    "by their next owner (see test_kafka_transport)"
)
PARTITION_OWNERSHIP_ON_KAFKA = (
    "on Kafka a message goes to the member that owns its partition, not to whichever member "
    "fetches next; splitting work across members is pinned down in test_kafka_transport"
)


@pytest.fixture(params=BROKERS)
async def transport(request: pytest.FixtureRequest) -> AsyncIterator[AnyTransport]:
    url = broker_url(request, "contract")
    opened = open_transport(url)
    assert isinstance(opened, MemoryTransport | RedisTransport | KafkaTransport)
    async with opened:
        yield opened


def not_on_kafka(transport: AnyTransport, reason: str) -> None:
    if isinstance(transport, KafkaTransport):
        pytest.skip(reason)


async def payloads(transport: AnyTransport, group: str, consumer: str, count: int) -> list[bytes]:
    return [d.payload for d in await transport.fetch("c", group, consumer, count, 0)]


async def test_each_message_goes_to_one_member_of_a_group(transport: AnyTransport):
    not_on_kafka(transport, PARTITION_OWNERSHIP_ON_KAFKA)
    await payloads(transport, "g", "a", 1)  # the group starts before the messages
    for n in range(4):
        await transport.publish("c", f"m{n}".encode())
    assert await payloads(transport, "g", "a", 2) == [b"m0", b"m1"]
    assert await payloads(transport, "g", "b", 10) == [b"m2", b"m3"]
    assert await payloads(transport, "g", "a", 10) == []


async def test_every_group_gets_every_message(transport: AnyTransport):
    for n in range(3):
        await transport.publish("c", f"m{n}".encode())
    assert await payloads(transport, "g", "a", 10) == [b"m0", b"m1", b"m2"]
    assert await payloads(transport, "h", "a", 10) == [b"m0", b"m1", b"m2"]


async def test_messages_published_before_a_group_exists_are_delivered_to_it(transport: AnyTransport):
    await transport.publish("c", b"early")
    await payloads(transport, "first", "a", 10)
    assert await payloads(transport, "late", "a", 10) == [b"early"]


async def test_fetch_times_out_empty(transport: AnyTransport):
    started = asyncio.get_running_loop().time()
    assert await transport.fetch("c", "g", "a", 1, 0.05) == []
    assert asyncio.get_running_loop().time() - started >= 0.04
    assert await transport.fetch("c", "g", "a", 1, 0) == []


async def test_fetch_waits_for_a_publish(transport: AnyTransport):
    await payloads(transport, "g", "a", 1)
    waiter = asyncio.create_task(transport.fetch("c", "g", "a", 1, 5))
    await asyncio.sleep(0.05)
    # The publish must get through while the fetch is blocked.
    async with asyncio.timeout(2):
        await transport.publish("c", b"hello")
        (delivery,) = await waiter
    assert delivery.payload == b"hello" and delivery.attempts == 1


async def test_unacked_messages_stay_pending_and_are_claimed_after_idling(transport: AnyTransport):
    await transport.publish("c", b"work")
    (delivery,) = await transport.fetch("c", "g", "dead-worker", 1, 0)
    # At once, before anything slow (a Kafka member joining its group) can pass IDLE_S.
    assert await transport.claim_stale("c", "g", "live", min_idle_s=IDLE_S, max_count=10) == []
    assert await transport.backlog("c", "g") == (0, 1)
    assert await payloads(transport, "g", "other", 10) == []
    await asyncio.sleep(IDLE_S * 1.5)
    (claimed,) = await transport.claim_stale("c", "g", "live", min_idle_s=IDLE_S, max_count=10)
    assert (claimed.message_id, claimed.payload) == (delivery.message_id, b"work")
    assert await transport.backlog("c", "g") == (0, 1)


async def test_attempts_increment_on_each_claim(transport: AnyTransport):
    await transport.publish("c", b"work")
    (delivery,) = await transport.fetch("c", "g", "a", 1, 0)
    assert delivery.attempts == 1
    loop, deliveries = asyncio.get_running_loop(), 1
    for consumer in ("b", "c", "d"):
        await asyncio.sleep(IDLE_S * 1.5)
        (claimed,) = await transport.claim_stale("c", "g", consumer, IDLE_S, 10)
        claimed_at = loop.time()
        deliveries += 1
        assert claimed.attempts == deliveries
        # A fresh claim resets the idle time: nobody can take it straight back, unless this
        # process was kept off the CPU for IDLE_S in between (a loaded machine), and then
        # that claim counts as a delivery too.
        again = await transport.claim_stale("c", "g", "x", IDLE_S, 10)
        if again:
            assert loop.time() - claimed_at >= IDLE_S, f"claimed straight back: {again}"
            deliveries += 1
            assert again[0].attempts == deliveries
    assert deliveries >= 4


async def test_claim_stale_respects_max_count_and_unknown_groups(transport: AnyTransport):
    for n in range(3):
        await transport.publish("c", f"m{n}".encode())
    await payloads(transport, "g", "a", 10)
    assert await transport.claim_stale("c", "nobody", "b", 0, 10) == []
    first = await transport.claim_stale("c", "g", "b", 0, 2)
    assert [d.payload for d in first] == [b"m0", b"m1"]


async def test_ack_removes_from_pending(transport: AnyTransport):
    assert await transport.backlog("c", "g") == (0, 0)
    for n in range(3):
        await transport.publish("c", f"m{n}".encode())
    assert await transport.backlog("c", "g") == (3, 0)
    deliveries = await transport.fetch("c", "g", "a", 2, 0)
    assert await transport.backlog("c", "g") == (1, 2)
    await transport.ack(deliveries[0])
    assert await transport.backlog("c", "g") == (1, 1)
    await transport.ack(deliveries[1])
    await transport.ack(deliveries[1])  # acking twice is harmless
    assert await transport.backlog("c", "g") == (1, 0)
    assert await transport.claim_stale("c", "g", "b", 0, 10) == []


async def test_ack_all_acks_each_of_a_read_at_once(transport: AnyTransport):
    for channel in ("c", "d"):
        await transport.fetch(channel, "g", "a", 1, 0)
        for n in range(3):
            await transport.publish(channel, f"{channel}{n}".encode())
    taken = [*await transport.fetch("c", "g", "a", 3, 5), *await transport.fetch("d", "g", "a", 2, 5)]
    assert [d.payload for d in taken] == [b"c0", b"c1", b"c2", b"d0", b"d1"]
    await transport.ack_all([])
    await transport.ack_all(taken)
    assert await transport.backlog("c", "g") == (0, 0)
    assert await transport.backlog("d", "g") == (1, 0)


# On a Redis Cluster the first pair is on two slots, the second on one.
@pytest.mark.parametrize(("requests", "replies"), [("c", "r"), ("{t}c", "{t}r")])
async def test_a_reply_is_published_and_its_request_acked(transport: AnyTransport, requests: str, replies: str):
    if isinstance(transport, KafkaTransport) and "{" in requests:
        pytest.skip("a Kafka topic's name cannot hold braces (and Kafka has no slots)")
    await transport.fetch(replies, "gateway", "a", 1, 0)  # its group exists before the reply
    await transport.publish(requests, b"question")
    (delivery,) = await transport.fetch(requests, "g", "a", 1, 5)
    assert await transport.backlog(requests, "g") == (0, 1)
    await transport.reply(replies, b"answer", delivery, headers=(("x", b"1"),))
    assert await transport.backlog(requests, "g") == (0, 0)
    (answer,) = await transport.fetch(replies, "gateway", "a", 1, 5)
    assert (answer.payload, answer.header("x")) == (b"answer", b"1")


async def test_a_reply_redis_refuses_leaves_its_request_pending(redis_url: str):
    flushdb(redis_url)
    async with RedisTransport(redis_url) as transport:
        await transport.publish("c", b"question")
        (delivery,) = await transport.fetch("c", "g", "a", 1, 0)
        await transport._redis.set("r", "not a stream")  # XADD onto it fails: WRONGTYPE
        with pytest.raises(TransportError):
            await transport.reply("r", b"answer", delivery)
        assert await transport.backlog("c", "g") == (0, 1), "acked without its reply"


async def test_a_renewed_delivery_is_not_claimed_while_its_holder_renews_it(redis_url: str):
    """Redis hands another member a delivery left unacked past the threshold even while its holder
    computes it; ``renew`` resets those the holder has, and nothing else."""
    flushdb(redis_url)
    idle = 1.0  # wide margins: each step below must fall on its side of the threshold
    async with RedisTransport(redis_url) as transport:
        for body in (b"slow", b"taken", b"retry"):
            await transport.publish("c", body)
        slow, taken, retry = await transport.fetch("c", "g", "a", 3, 0)
        assert await transport.renew("c", "g", "a", [], idle / 2) == 0
        await asyncio.sleep(idle * 0.6)
        await transport.release(retry)  # given up for a retry elsewhere: renewing must not keep it
        # Only what "a" holds, unacked half the threshold: not "b"'s, however long.
        assert await transport.renew("c", "g", "b", [slow.message_id], idle / 2) == 0
        assert await transport.renew("c", "g", "a", [slow.message_id, retry.message_id], idle / 2) == 1
        assert await transport.renew("c", "g", "a", [slow.message_id], idle / 2) == 0  # just renewed
        await asyncio.sleep(idle * 0.6)  # "taken" is past the threshold now, "slow" is not
        claimed = await transport.claim_stale("c", "g", "b", idle, 10)
        assert sorted(d.payload for d in claimed) == [b"retry", b"taken"]
        assert [d.attempts for d in claimed] == [2, 2]
        await asyncio.sleep(idle * 0.6)
        (late,) = await transport.claim_stale("c", "g", "b", idle, 10)
        assert (late.payload, late.attempts) == (b"slow", 2)  # its count kept through the renewal
        assert await transport.renew("c", "g", "a", [slow.message_id], 0) == 0  # "b" holds it now


async def test_reads_reuse_their_connection_and_a_restarted_server_costs_none_a_failure():
    """A read keeps the connection it ended on for the next one, out of the pool; after the server
    restarts, that connection is dead, and the next read must be made on a fresh one, as a pooled
    read would be, not fail, while the broker's failure is still counted."""
    with RedisServer(extra=("--appendonly", "yes", "--appendfsync", "always")) as server:
        async with RedisTransport(server.url) as transport:
            await transport.publish("c", b"first")
            for _ in range(3):
                await transport.fetch("c", "g", "a", 10, 0.05)
            assert len(transport._kept) == 1, "one connection, kept from read to read"
            await transport.publish("c", b"second")  # on disk: the restarted server has it
            failures = transport.failures
            server.crash()
            server.restart()
            assert [d.payload for d in await transport.fetch("c", "g", "a", 10, 1)] == [b"second"]
            # Counted all the same, as a pooled read cut off was: the lost-request ledger looks then.
            assert transport.failures == failures + 1


async def test_headers_travel_with_the_message(transport: AnyTransport):
    await transport.publish("c", b"body", key="k1", headers=(("content-type", b"application/json"), ("x", b"")))
    (delivery,) = await transport.fetch("c", "g", "a", 1, 0)
    assert delivery.header("Content-Type") == b"application/json" and delivery.header("x") == b""
    assert delivery.header("missing") is None and delivery.payload == b"body"


async def test_fetch_first_drains_earlier_channels_first(transport: AnyTransport):
    await transport.fetch_first(("hi", "lo"), "g", "a", 1, 0)  # the groups start before the messages
    for n in range(2):
        await transport.publish("lo", f"lo{n}".encode())
    await transport.publish("hi", b"hi0")
    first = await transport.fetch_first(("hi", "lo"), "g", "a", 10, 0)
    assert [(d.channel, d.payload) for d in first] == [("hi", b"hi0")]
    rest = await transport.fetch_first(("hi", "lo"), "g", "a", 10, 0)
    assert [(d.channel, d.payload) for d in rest] == [("lo", b"lo0"), ("lo", b"lo1")]
    assert await transport.fetch_first(("hi", "lo"), "g", "a", 10, 0) == []


async def test_fetch_first_waits_on_every_channel(transport: AnyTransport):
    await transport.fetch_first(("hi", "lo"), "g", "a", 1, 0)
    waiter = asyncio.create_task(transport.fetch_first(("hi", "lo"), "g", "a", 10, 5))
    await asyncio.sleep(0.05)
    async with asyncio.timeout(2):
        await transport.publish("lo", b"late")
        (delivery,) = await waiter
    assert (delivery.channel, delivery.payload, delivery.consumer) == ("lo", b"late", "a")


async def test_a_released_delivery_is_claimable_at_once_with_its_count(transport: AnyTransport):
    not_on_kafka(transport, NO_CLAIMS_ON_KAFKA + "; release re-publishes instead")
    await transport.publish("c", b"retry me")
    (delivery,) = await transport.fetch("c", "g", "a", 1, 0)
    assert await transport.claim_stale("c", "g", "b", 60, 10) == []
    await transport.release(delivery)
    (claimed,) = await transport.claim_stale("c", "g", "b", 60, 10)
    assert (claimed.message_id, claimed.attempts, claimed.consumer) == (delivery.message_id, 2, "b")


async def test_trim_never_drops_what_a_group_has_not_acked(transport: AnyTransport):
    not_on_kafka(transport, "Kafka's retention policy trims, never the transport; this test also checks through claim_stale")
    await transport.fetch("c", "fast", "a", 1, 0)
    await transport.fetch("c", "slow", "a", 1, 0)
    for n in range(6):
        await transport.publish("c", f"m{n}".encode())
    fast = await transport.fetch("c", "fast", "a", 6, 0)
    slow = await transport.fetch("c", "slow", "a", 3, 0)  # m0..m2 pending, m3..m5 unread
    for delivery in fast + slow[1:]:
        await transport.ack(delivery)
    await transport.trim("c")
    # "slow" still holds m0 unacked and has m3..m5 to read: all of it survives.
    await asyncio.sleep(IDLE_S * 1.5)
    (stale,) = await transport.claim_stale("c", "slow", "b", IDLE_S, 10)
    assert stale.payload == b"m0"
    assert [d.payload for d in await transport.fetch("c", "slow", "a", 10, 0)] == [b"m3", b"m4", b"m5"]
    await transport.ack(stale)
    await transport.trim("c")
    assert await transport.backlog("c", "slow") == (0, 3)


async def test_trim_drops_entries_every_group_acked(redis_url: str):
    flushdb(redis_url)
    async with RedisTransport(redis_url) as transport:
        await transport.fetch("c", "g", "a", 1, 0)
        for n in range(10):
            await transport.publish("c", f"m{n}".encode())
        deliveries = await transport.fetch("c", "g", "a", 10, 0)
        for delivery in deliveries[:7]:
            await transport.ack(delivery)
        dropped = await transport.trim("c")
        # m7 is the oldest pending entry: everything before it goes.
        assert dropped == 7
        assert await transport.trim("c") == 0
        for delivery in deliveries[7:]:
            await transport.ack(delivery)
        # With nothing pending, the last delivered entry itself is kept.
        assert await transport.trim("c") == 2
        assert await transport.trim("missing") == 0


async def test_cap_keeps_only_the_newest_messages(transport: AnyTransport):
    for n in range(10):
        await transport.publish("c", f"m{n}".encode())
    assert await transport.cap("c", 4) == 6
    assert await transport.cap("c", 4) == 0
    assert await payloads(transport, "late", "a", 10) == [b"m6", b"m7", b"m8", b"m9"]
    assert await transport.cap("missing", 4) == 0


async def test_cap_drops_what_a_group_has_not_read_or_acked(transport: AnyTransport):
    not_on_kafka(transport, "a Kafka member may already hold dropped records in its buffer; claims reach only those")
    await transport.fetch("c", "g", "a", 1, 0)
    for n in range(6):
        await transport.publish("c", f"m{n}".encode())
    await transport.fetch("c", "g", "a", 2, 0)  # m0, m1 pending; m2..m5 unread
    assert await transport.cap("c", 3) == 3
    await asyncio.sleep(IDLE_S * 1.5)
    assert await transport.claim_stale("c", "g", "b", IDLE_S, 10) == []
    assert await payloads(transport, "g", "a", 10) == [b"m3", b"m4", b"m5"]


@pytest.mark.parametrize("size", [0, 1, 1 << 20])
async def test_payload_bytes_round_trip_exactly(transport: AnyTransport, size: int):
    payload = os.urandom(size)
    message_id = await transport.publish("c", payload)
    (delivery,) = await transport.fetch("c", "g", "a", 1, 0)
    assert (delivery.message_id, delivery.payload) == (message_id, payload)
    assert type(delivery.payload) is bytes


async def test_closed_transport_refuses_work_and_wakes_waiters(transport: AnyTransport):
    await transport.publish("c", b"x")
    (delivery,) = await transport.fetch("c", "g", "a", 1, 0)
    waiter = asyncio.create_task(transport.fetch("c", "g", "a", 1, 5))
    await asyncio.sleep(0.05)
    async with asyncio.timeout(2):
        await transport.aclose()
        with pytest.raises(TransportClosed):
            await waiter
    with pytest.raises(TransportClosed):
        await transport.publish("c", b"x")
    with pytest.raises(TransportClosed):
        await transport.fetch("c", "g", "a", 1, 0)
    with pytest.raises(TransportClosed):
        await transport.ack(delivery)
    with pytest.raises(TransportClosed):
        await transport.claim_stale("c", "g", "a", 0, 1)
    with pytest.raises(TransportClosed):
        await transport.backlog("c", "g")
    await transport.aclose()  # closing twice is harmless


async def test_a_fetch_closed_on_before_its_read_starts_wakes_too(transport: AnyTransport):
    # The fetch passes its open check, then waits on something else (creating its group, on
    # Redis); closing meanwhile must still wake it, not leave a read the close never saw.
    waiter = asyncio.create_task(transport.fetch("c", "new-group", "a", 1, 5))
    await asyncio.sleep(0)
    async with asyncio.timeout(2):
        await transport.aclose()
        with pytest.raises(TransportClosed):
            await waiter


async def test_a_fetch_cancelled_as_its_transport_closes_stays_cancelled(transport: AnyTransport):
    # Closing wakes a blocked fetch with TransportClosed; a fetch its caller cancelled too must
    # still end cancelled, or a reader shut down at the same moment would not know it was.
    waiter = asyncio.create_task(transport.fetch("c", "g", "a", 1, 5))
    await asyncio.sleep(0.2)
    waiter.cancel()
    async with asyncio.timeout(2):
        await transport.aclose()
        with pytest.raises(asyncio.CancelledError):
            await waiter


async def test_redis_failures_surface_as_transport_error():
    async with RedisTransport(f"redis://127.0.0.1:{free_port()}/0") as unreachable:
        with pytest.raises(TransportError):
            await unreachable.publish("c", b"x")
