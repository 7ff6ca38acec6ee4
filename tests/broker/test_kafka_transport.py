"""What the Kafka transport does beyond the shared contract: offsets, rebalances, retries."""

import asyncio
import os
import time
import uuid
from dataclasses import replace

import pytest

from broker.errors import BrokerError, TransportError
from broker.transport import Delivery
from broker.transports.kafka import KafkaTransport
from broker.transports.kafka_admin import shares
from broker.transports.kafka_settings import KafkaSettings
from tests.redis_server import free_port

MIB = 1 << 20


def settings(bootstrap: str, **overrides: object) -> KafkaSettings:
    """Fresh topic and group names on the session's shared broker, and a short session."""
    namespace = f"kt-{uuid.uuid4().hex[:12]}."
    return KafkaSettings.from_url(f"kafka://{bootstrap}", namespace=namespace, session_timeout_ms=6_000,
                                  heartbeat_interval_ms=500, **overrides)  # fmt: skip


async def publish_all(transport: KafkaTransport, count: int, channel: str = "c") -> None:
    for n in range(count):
        await transport.publish(channel, f"m{n}".encode())


async def drain(transport: KafkaTransport, group: str, consumer: str, channel: str = "c") -> list[Delivery]:
    """Everything there is, each acked as it comes, as a worker would."""
    taken: list[Delivery] = []
    while batch := await transport.fetch(channel, group, consumer, 100, 0):
        for delivery in batch:
            await transport.ack(delivery)
        taken += batch
    return taken


def payloads(deliveries: list[Delivery]) -> list[bytes]:
    return [d.payload for d in deliveries]


# -- settings, without a broker ---------------------------------------------


def test_url_gives_bootstrap_partitions_and_settings():
    parsed = KafkaSettings.from_url("kafka://a:9092,b:9093?partitions=8&namespace=x.&catch_up_timeout_s=2.5")
    assert (parsed.bootstrap, parsed.partitions, parsed.namespace) == (("a:9092", "b:9093"), 8, "x.")
    assert parsed.catch_up_timeout_s == 2.5
    with pytest.raises(BrokerError):
        KafkaSettings.from_url("kafka://a:9092?partitons=8")
    with pytest.raises(BrokerError):
        KafkaSettings.from_url("redis://a:9092")


# -- against a real broker ---------------------------------------------------


async def test_offsets_are_committed_only_after_ack(kafka_bootstrap: str):
    config = settings(kafka_bootstrap, partitions=1)
    async with KafkaTransport(config) as transport:
        await publish_all(transport, 3)
        first, *_ = await transport.fetch("c", "g", "a", 3, 0)
        await transport.ack(first)
    async with KafkaTransport(config) as reopened:
        again = await drain(reopened, "g", "b")
    # m1 was the oldest message handed out and lost: counted (kafka_marks).
    assert [(d.payload, d.attempts) for d in again] == [(b"m1", 2), (b"m2", 1)]


async def test_a_message_taken_and_lost_comes_back_alone_and_counted(kafka_bootstrap: str):
    """Each member takes the oldest message and goes without acking it, as a
    worker it kills would: the next one gets it on its own, one count higher."""
    config = settings(kafka_bootstrap, partitions=1)
    async with KafkaTransport(config) as first:
        await publish_all(first, 3)
        (taken,) = await first.fetch("c", "g", "a", 1, 0)
    counts = [taken.attempts]
    for _ in range(2):
        async with KafkaTransport(config) as member:
            taken, *others = await member.fetch("c", "g", "a", 10, 0)
            assert (taken.payload, others) == (b"m0", [])
            assert await member.fetch("c", "g", "a", 10, 0.3) == []  # nothing else while it is out
            counts.append(taken.attempts)
    assert counts == [1, 2, 3]
    async with KafkaTransport(config) as last:
        assert [(d.payload, d.attempts) for d in await drain(last, "g", "a")] == [
            (b"m0", 4), (b"m1", 1), (b"m2", 1)]


async def test_after_a_death_each_ack_releases_the_next_message_at_once(kafka_bootstrap: str):
    """Single file after a death (kafka_marks) must not cost a fetch timeout a
    message: the worker's next fetch is already waiting when it acks, and the
    ack must release the next message to it, not the end of that wait."""
    config = settings(kafka_bootstrap, partitions=1)
    count, fetch_timeout_s = 10, 1.0
    async with KafkaTransport(config) as first:
        await publish_all(first, count + 1)
        await first.fetch("c", "g", "a", 1, 0)  # taken and lost, as by a worker killed holding it
    async with KafkaTransport(config) as second:
        (held,) = await second.fetch("c", "g", "a", 10, 0)
        handled = [held]
        started = time.monotonic()
        while len(handled) <= count:
            waiting = asyncio.create_task(second.fetch("c", "g", "a", 10, fetch_timeout_s))
            await asyncio.sleep(0.01)  # the fetch is waiting, as a worker's is while it handles one
            await second.ack(handled[-1])
            handled += await waiting
        elapsed = time.monotonic() - started
    assert payloads(handled) == [f"m{n}".encode() for n in range(count + 1)]
    assert elapsed < count * 0.3, f"{count} messages one at a time took {elapsed:.1f} s"


async def test_a_full_inbox_resumes_fetching_as_soon_as_it_has_room(kafka_bootstrap: str):
    """Messages arrive faster than they are handled, so the member's inbox fills and its
    partitions are paused. Taking from it must resume them then, not after a poll interval
    (10 s here) spent polling paused partitions: that capped a worker at a full inbox per
    poll interval (about 300 requests/s over Kafka with the defaults)."""
    config = settings(kafka_bootstrap, partitions=1, buffer_records=2, poll_interval_ms=10_000)
    count = 20
    async with KafkaTransport(config) as transport:
        await transport.publish("c", b"first")
        (first,) = await transport.fetch("c", "g", "a", 1, 30)  # joined and reading
        await transport.ack(first)
        started = time.monotonic()

        async def publish_fast() -> None:
            for n in range(count):
                await transport.publish("c", f"m{n}".encode())
                await asyncio.sleep(0.01)

        publishing = asyncio.create_task(publish_fast())
        handled: list[Delivery] = []
        async with asyncio.timeout(30):
            while len(handled) < count:
                for delivery in await transport.fetch("c", "g", "a", 1, 10):
                    await asyncio.sleep(0.05)  # slower than they come: the inbox fills
                    await transport.ack(delivery)
                    handled.append(delivery)
        await publishing
        elapsed = time.monotonic() - started
    assert payloads(handled) == [f"m{n}".encode() for n in range(count)]
    assert elapsed < 6, f"{count} messages took {elapsed:.1f} s: fetching resumed only after a poll interval"


async def test_a_clean_leave_counts_nothing(kafka_bootstrap: str):
    config = settings(kafka_bootstrap, partitions=1)
    async with KafkaTransport(config) as first:
        await publish_all(first, 2)
        (taken,) = await first.fetch("c", "g", "a", 1, 0)  # m1 is buffered behind it, never handed out
        await first.ack(taken)
    async with KafkaTransport(config) as second:
        assert [(d.payload, d.attempts) for d in await drain(second, "g", "a")] == [(b"m1", 1)]


async def test_commits_stop_at_the_first_unacked_offset(kafka_bootstrap: str):
    config = settings(kafka_bootstrap, partitions=1)
    async with KafkaTransport(config) as transport:
        await publish_all(transport, 3)
        m0, m1, m2 = await transport.fetch("c", "g", "a", 3, 0)
        await transport.ack(m2)
        await transport.ack(m0)
    async with KafkaTransport(config) as reopened:
        assert payloads(await drain(reopened, "g", "a")) == [b"m1", b"m2"]


async def test_members_of_a_group_split_the_partitions(kafka_bootstrap: str):
    config = settings(kafka_bootstrap, partitions=4)
    async with KafkaTransport(config) as transport:
        await transport.fetch("c", "g", "a", 1, 0)
        await transport.fetch("c", "g", "b", 1, 0)  # joins: a gives up some partitions
        await transport.fetch("c", "g", "a", 1, 0)  # a's side of the rebalance settles
        await transport.publish("c", b"warm")  # the first send to a topic picks one partition
        for n in range(40):
            await transport.publish("c", f"m{n}".encode(), key=f"k{n}")
        seen: dict[str, list[Delivery]] = {"a": [], "b": []}
        async with asyncio.timeout(20):
            while sum(map(len, seen.values())) < 41:
                for consumer, got in seen.items():
                    batch = await transport.fetch("c", "g", consumer, 100, 0.05)
                    for delivery in batch:
                        await transport.ack(delivery)
                    got += batch
    assert seen["a"] and seen["b"]
    everything = payloads(seen["a"] + seen["b"])
    assert sorted(everything) == sorted([b"warm"] + [f"m{n}".encode() for n in range(40)])
    assert {d.message_id.split("-")[0] for d in seen["a"]}.isdisjoint(d.message_id.split("-")[0] for d in seen["b"])


async def test_a_member_giving_up_partitions_waits_for_the_answers_in_hand(kafka_bootstrap: str):
    # a holds every record unacked when b joins; a's handlers ack them a second later,
    # during the rebalance. Had a let its partitions go at once, b would read those
    # records again from the old commit, and each would be answered twice.
    config = settings(kafka_bootstrap, partitions=4)
    async with KafkaTransport(config) as transport:
        await transport.fetch("c", "g", "a", 1, 0)
        await publish_all(transport, 9)
        held: list[Delivery] = []
        async with asyncio.timeout(20):
            while len(held) < 9:
                held += await transport.fetch("c", "g", "a", 9, 0.2)

        async def answer_later() -> None:
            await asyncio.sleep(1.0)
            for delivery in held:
                await transport.ack(delivery)

        answering = asyncio.create_task(answer_later())
        again = await transport.fetch("c", "g", "b", 100, 0)  # joins: a gives up two partitions
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            again += await transport.fetch("c", "g", "b", 100, 0.2)
        await answering
    assert len({d.message_id.split("-")[0] for d in held}) == 4
    assert payloads(again) == []


async def test_unkeyed_messages_go_round_the_partitions_and_a_key_keeps_to_one(kafka_bootstrap: str):
    async with KafkaTransport(settings(kafka_bootstrap, partitions=4)) as transport:
        unkeyed = [await transport.publish("c", f"m{n}".encode()) for n in range(8)]
        keyed = [await transport.publish("c", f"s{n}".encode(), key="sequence-7") for n in range(6)]
    partitions = [message_id.split("-")[0] for message_id in unkeyed]
    assert sorted(partitions) == sorted(["0", "1", "2", "3"] * 2), partitions
    assert len({message_id.split("-")[0] for message_id in keyed}) == 1, keyed


async def test_a_member_that_stops_fetching_keeps_its_partitions(kafka_bootstrap: str):
    # 10 s rather than less: the member's thread polls every 100 ms, but its turn also makes
    # blocking broker calls, and on a machine starved of CPU (two hogs beside the suite) a turn
    # has outlasted 1 s and 3 s; the member then rightly left the group, and its records came
    # round again.
    # Under that load kafka-python also wedges, now and then, in its very first join (see
    # kafka_watch): the watch replaces the consumer and what was not committed comes round
    # again, as at-least-once allows. That is not what this test is about, so a try in which
    # the member was replaced is run again, on fresh names; one without must be exact.
    # Five tries: on a starved machine the wedge has struck three tries in a row.
    for _ in range(5):
        config = settings(kafka_bootstrap, partitions=1, max_poll_interval_ms=10_000, buffer_records=1)
        async with KafkaTransport(config) as transport:
            await publish_all(transport, 5)
            (first,) = await transport.fetch("c", "g", "a", 1, 0)
            # Past max.poll.interval.ms: only the member's own polling keeps it in the group.
            await asyncio.sleep(12.0)
            await transport.ack(first)
            rest = await drain(transport, "g", "a")
            extra = await transport.fetch("c", "g", "a", 10, 0.5)
            if transport.member_restarts("g", "a"):
                continue
            assert payloads([first, *rest]) == [f"m{n}".encode() for n in range(5)]
            assert extra == []
            return
    pytest.fail("the member's first join wedged in each of 5 tries")


async def test_a_released_delivery_comes_back_with_its_count_key_and_headers(kafka_bootstrap: str):
    async with KafkaTransport(settings(kafka_bootstrap, partitions=1)) as transport:
        await transport.publish("c", b"retry me", key="request-1", headers=(("content-type", b"x/y"),))
        (delivery,) = await transport.fetch("c", "g", "a", 1, 0)
        assert (delivery.attempts, delivery.header("kafka-key")) == (1, b"request-1")
        assert await transport.claim_stale("c", "g", "b", 60, 10) == []
        await transport.release(delivery)
        (again,) = await transport.fetch("c", "g", "a", 1, 5)
    assert (again.payload, again.attempts, again.header("content-type")) == (b"retry me", 2, b"x/y")
    assert again.header("kafka-key") == b"request-1" and again.message_id != delivery.message_id
    assert [name for name, _ in again.headers].count("kafka-key") == 1


async def test_a_delivery_left_unacked_is_claimed_again_and_its_ack_commits(kafka_bootstrap: str):
    """What a live member handed out and never acked (its reply could not be
    published, say) comes back from claim_stale, not only after a rebalance."""
    config = settings(kafka_bootstrap, partitions=1)
    async with KafkaTransport(config) as transport:
        await publish_all(transport, 2)
        first, second = await transport.fetch("c", "g", "a", 2, 0)
        await transport.ack(second)
        await asyncio.sleep(0.3)
        (claimed,) = await transport.claim_stale("c", "g", "b", 0.2, 10)
        assert (claimed.message_id, claimed.attempts, claimed.consumer) == (first.message_id, 2, "a")
        assert await transport.claim_stale("c", "g", "b", 0.2, 10) == []  # the claim reset its idle time
        await transport.ack(claimed)
        assert await transport.claim_stale("c", "g", "b", 0, 10) == []
    async with KafkaTransport(config) as reopened:
        assert await reopened.backlog("c", "g") == (0, 0)


async def test_backlog_counts_from_the_committed_offsets(kafka_bootstrap: str):
    config = settings(kafka_bootstrap, partitions=2)
    async with KafkaTransport(config) as transport:
        assert await transport.backlog("c", "g") == (0, 0)
        await publish_all(transport, 5)
        assert await transport.backlog("c", "g") == (5, 0)
        taken = await transport.fetch("c", "g", "a", 3, 0)
        await transport.ack(taken[0])
        assert await transport.backlog("c", "g") == (2, len(taken) - 1)
        assert await transport.trim("c") == 0
    async with KafkaTransport(config) as reopened:
        # Only the acked message was committed; the two taken but unacked count as unread again.
        assert await reopened.backlog("c", "g") == (4, 0)


async def test_an_8_mib_message_round_trips(kafka_bootstrap: str):
    payload = os.urandom(8 * MIB)
    async with KafkaTransport(settings(kafka_bootstrap, partitions=1)) as transport:
        message_id = await transport.publish("c", payload)
        (delivery,) = await transport.fetch("c", "g", "a", 1, 0)
    assert (delivery.message_id, delivery.payload) == (message_id, payload)


@pytest.mark.parametrize(("total", "parts", "split"), [(6, 4, [2, 2, 1, 1]), (3, 4, [1, 1, 1, 0]), (8, 1, [8])])
def test_a_cap_is_shared_out_over_the_partitions(total: int, parts: int, split: list[int]):
    assert shares(total, parts) == split


async def test_cap_keeps_each_partition_its_share_of_the_newest(kafka_bootstrap: str):
    async with KafkaTransport(settings(kafka_bootstrap, partitions=4)) as transport:
        await publish_all(transport, 10)  # round robin: m0, m4, m8 on partition 0; m3, m7 on partition 3
        assert await transport.cap("c", 6) == 4
        kept = payloads(await drain(transport, "late", "a"))
    assert sorted(kept) == sorted(f"m{n}".encode() for n in range(4, 10))


async def test_broker_failures_surface_as_transport_error():
    config = replace(KafkaSettings.from_url(f"kafka://127.0.0.1:{free_port()}"), request_timeout_ms=500)
    async with KafkaTransport(config) as unreachable:
        with pytest.raises(TransportError):
            await unreachable.publish("c", b"x")
        with pytest.raises(TransportError):
            await unreachable.backlog("c", "g")


def topic_settings(bootstrap: str, topic: str) -> tuple[int, str]:
    """A topic's replication factor and ``min.insync.replicas``, as the cluster reports them."""
    from broker.transports.kafka_api import ConfigResource, ConfigResourceType, KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap.split(","))
    try:
        [described] = admin.describe_topics([topic])
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                                         configs=["min.insync.replicas"])])
    finally:
        admin.close()
    return len(described["partitions"][0]["replica_nodes"]), configs["topic"][topic]["min.insync.replicas"]["value"]


async def test_topics_are_created_as_replicated_as_the_cluster_allows_and_a_larger_factor_is_refused(
    kafka_bootstrap: str,
):
    chosen = settings(kafka_bootstrap)
    async with KafkaTransport(chosen) as transport:
        await transport.publish("c", b"x")
    assert topic_settings(kafka_bootstrap, f"{chosen.namespace}c") == (1, "1")  # one broker here
    too_many = settings(kafka_bootstrap, replication_factor=3)
    async with KafkaTransport(too_many) as transport:
        with pytest.raises(TransportError, match=r"replication_factor=3 for topic '.*c', but the cluster has 1"):
            await transport.publish("c", b"x")
