"""Queue lag and pending per model request channel: what ``ferry lag`` and
``ferry_queue_*`` report, and that it is what Redis itself (and so KEDA) sees."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker import channels
from broker.transports import MemoryTransport, RedisTransport
from gateway.backlog import BacklogCollector, BacklogPoller, QueueBacklog, read_backlog
from tests.servers import free_port


async def publish(transport, channel: str, count: int) -> None:
    for index in range(count):
        await transport.publish(channel, b"%d" % index)


async def test_lag_counts_what_the_group_was_not_handed_and_pending_what_it_holds():
    transport = MemoryTransport()
    high, low = channels.request_channels("ranked", 2)
    await publish(transport, high, 3)
    await publish(transport, low, 2)
    group = channels.worker_group("ranked")
    taken = await transport.fetch(high, group, "c1", max_count=2, timeout_s=0)
    rows = await read_backlog(transport, [("ranked", 2), ("idle", 0)])
    assert rows == [
        QueueBacklog("ranked", high, group, lag=1, pending=2),
        QueueBacklog("ranked", low, group, lag=2, pending=0),
        QueueBacklog("idle", channels.request_channel("idle"), channels.worker_group("idle"), lag=0, pending=0),
    ]
    assert rows[0].depth == 3
    for delivery in taken:
        await transport.ack(delivery)
    assert (await read_backlog(transport, [("ranked", 2)]))[0] == QueueBacklog("ranked", high, group, 1, 0)


async def test_the_poller_refreshes_in_the_background_and_the_collector_renders_its_snapshot():
    transport = MemoryTransport()
    models = [("add_sub", 0)]
    poller = BacklogPoller(transport, lambda: models, interval_s=0.02)
    assert poller.snapshot() == []
    await poller.start()
    try:
        await publish(transport, channels.request_channel("add_sub"), 4)
        await wait_until(lambda: [row.lag for row in poller.snapshot()] == [4])
        registry = CollectorRegistry()
        registry.register(BacklogCollector(poller))
        samples = {(s.name, s.labels["channel"], s.labels["group"], s.labels["model"]): s.value
                   for family in text_string_to_metric_families(generate_latest(registry).decode())
                   for s in family.samples}
        key = (channels.request_channel("add_sub"), channels.worker_group("add_sub"), "add_sub")
        assert samples[("ferry_queue_lag", *key)] == 4
        assert samples[("ferry_queue_pending", *key)] == 0
        assert samples[("ferry_queue_depth", *key)] == 4
        models.append(("later", 0))  # models are asked for on each refresh
        await wait_until(lambda: len(poller.snapshot()) == 2)
    finally:
        await poller.aclose()


async def test_the_poller_outlives_a_broker_it_cannot_reach():
    transport = RedisTransport(f"redis://127.0.0.1:{free_port()}/0")
    poller = BacklogPoller(transport, lambda: [("add_sub", 0)], interval_s=0.01)
    await poller.start()
    try:
        await asyncio.sleep(0.2)
        assert poller.snapshot() == []
        await poller.refresh()  # a failed read is logged, not raised
    finally:
        await poller.aclose()
        await transport.aclose()


async def test_on_redis_lag_is_xinfo_groups_lag_and_pending_is_xpendings_count(redis_url: str):
    raw = aioredis.Redis.from_url(redis_url)
    await raw.flushdb()
    transport = RedisTransport(redis_url)
    try:
        stream, group = channels.request_channel("add_sub"), channels.worker_group("add_sub")
        await publish(transport, stream, 5)
        # No group yet: everything is still to be delivered.
        assert await read_backlog(transport, [("add_sub", 0)]) == [QueueBacklog("add_sub", stream, group, 5, 0)]
        taken = await transport.fetch(stream, group, "c1", max_count=3, timeout_s=0.1)
        await transport.ack(taken[0])
        [row] = await read_backlog(transport, [("add_sub", 0)])
        [info] = await raw.xinfo_groups(stream)
        summary = await raw.xpending(stream, group)
        assert (row.lag, row.pending) == (int(info["lag"]), int(summary["pending"])) == (2, 2)
    finally:
        await transport.aclose()
        await raw.flushdb()
        await raw.aclose()


async def wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail("condition not met in time")
        await asyncio.sleep(0.01)
