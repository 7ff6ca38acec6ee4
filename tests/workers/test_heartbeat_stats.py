"""A heartbeat carries its worker's StatsBook: round trip, old beats, bad
stats, the size bound, and both stores (Redis keys and a channel)."""

from __future__ import annotations

import asyncio
import copy

import msgpack
import pytest

from broker.transports.memory import MemoryTransport
from tests.redis_server import flushdb
from workers.heartbeat import (MAX_HEARTBEAT_BYTES, Heartbeat, HeartbeatSettings, RedisHeartbeats, decode_beat,
                               decode_heartbeat, encode_heartbeat)
from workers.heartbeat_channel import ChannelHeartbeats
from workers.telemetry.stats import StatsBook
from workers.telemetry.timeline import BatchRecord, Timeline
from workers.telemetry.wire import parse_stats

NS = 1_000_000_000


def book_with(requests: list[tuple[str, int, float]], model: str = "add_sub") -> StatsBook:
    """A StatsBook that saw one batch per (outcome, rows, seconds) request."""
    book = StatsBook()
    for i, (outcome, rows, seconds) in enumerate(requests):
        timeline = Timeline(f"r{i}", model, "1", "w1", enqueued_ns=NS, received_ns=NS)
        book.received(timeline)
        batch = BatchRecord(model, "1", f"b{i}", rows, 1, NS, NS + int(seconds * NS / 2))
        book.batch_ran(batch)
        timeline.ran_in(batch)
        timeline.rows, timeline.outcome, timeline.done_ns = rows, outcome, NS + int(seconds * NS)
        book.finished(timeline)
    return book


def test_stats_round_trip_through_a_heartbeat():
    stats = book_with([("success", 4, 0.002), ("success", 8, 0.004), ("internal", 1, 0.001)]).to_wire()
    beat = decode_beat(encode_heartbeat("w1", {"add_sub": (1,)}, 5 * NS, 3.0, stats))
    assert beat is not None
    assert (beat.worker, beat.models, beat.sent_ns) == ("w1", {"add_sub": (1,)}, 5 * NS)
    assert beat.stats == stats
    assert beat.stats["models"]["add_sub/1"]["inferences"] == 12
    assert beat.stats["models"]["add_sub/1"]["failures"] == {"internal": 1}


def test_a_heartbeat_without_stats_still_decodes_as_before():
    raw = encode_heartbeat("w1", {"m": (1, 2)}, NS)
    assert "stats" not in msgpack.unpackb(raw)
    assert decode_heartbeat(raw) == ("w1", {"m": (1, 2)})
    beat = decode_beat(raw)
    assert beat is not None and beat.stats is None


def _broken(path: list[str | int], value: object) -> dict:
    stats = book_with([("success", 2, 0.001)]).to_wire()
    node = stats
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return stats


@pytest.mark.parametrize("stats", [
    "not a map",
    {"models": []},
    _broken(["models", "add_sub/1", "success"], -1),
    _broken(["models", "add_sub/1", "inferences"], "12"),
    _broken(["models", "add_sub/1", "executions"], True),
    _broken(["models", "add_sub/1", "batch_sizes", "counts"], [1, 2, 3]),
    _broken(["models", "add_sub/1", "request", "sum"], "fast"),
    _broken(["models", "add_sub/1", "failures"], {"internal": -3}),
    _broken(["pending"], {"add_sub": "many"}),
    {"models": {"no-version": book_with([]).model("m", "1").to_wire()}, "pending": {}},
], ids=["not-a-map", "models-list", "negative", "string-count", "bool-count", "short-histogram", "string-sum",
        "negative-failures", "string-pending", "key-without-version"])
def test_bad_stats_are_ignored_and_the_beat_still_counts(stats):
    beat = decode_beat(encode_heartbeat("w1", {"m": (1,)}, NS, 3.0, stats))
    assert beat is not None and beat.models == {"m": (1,)}
    assert beat.stats is None


def test_good_stats_pass_the_same_checks():
    stats = book_with([("success", 2, 0.001)]).to_wire()
    assert parse_stats(copy.deepcopy(stats)) == stats


def test_stats_too_large_for_a_heartbeat_are_dropped_and_the_beat_is_sent():
    book = StatsBook()
    for i in range(1000):
        book.model(f"model_with_a_long_name_{i:04}", "1").success = i
    raw = encode_heartbeat("w1", {"m": (1,)}, NS, 3.0, book.to_wire())
    assert len(raw) <= MAX_HEARTBEAT_BYTES and "stats" not in msgpack.unpackb(raw)
    beat = decode_beat(raw)
    assert beat is not None and beat.models == {"m": (1,)} and beat.stats is None


def test_stats_in_a_heartbeat_over_the_bound_are_ignored_on_decode():
    book = StatsBook()
    for i in range(1000):
        book.model(f"model_with_a_long_name_{i:04}", "1").success = i
    body = msgpack.unpackb(encode_heartbeat("w1", {"m": (1,)}, NS, 3.0))
    raw = msgpack.packb({**body, "stats": book.to_wire()})  # what ferry's encoder would not send
    assert len(raw) > MAX_HEARTBEAT_BYTES and parse_stats(book.to_wire()) is not None
    beat = decode_beat(raw)
    assert beat is not None and beat.models == {"m": (1,)} and beat.stats is None


async def test_a_heartbeat_publishes_its_worker_stats_over_a_channel():
    book = book_with([("success", 4, 0.002)])
    async with MemoryTransport() as transport:
        store = ChannelHeartbeats(transport, "w1", poll_timeout_s=0.05)
        reader = ChannelHeartbeats(transport, "gw", poll_timeout_s=0.05)
        heartbeat = Heartbeat(store, "w1", lambda: {"add_sub": (1,)}, HeartbeatSettings(interval_s=0.05),
                              stats=book.to_wire)
        try:
            await heartbeat.start()
            async with asyncio.timeout(5):
                while "w1" not in await reader.beats():
                    await asyncio.sleep(0.01)
                book.model("add_sub", "1").success += 5  # the next beat carries the new count
                while (await reader.beats())["w1"].stats["models"]["add_sub/1"]["success"] != 6:
                    await asyncio.sleep(0.01)
            assert await reader.live() == {"w1": {"add_sub": (1,)}}
        finally:
            await heartbeat.aclose()
            await reader.aclose()
            await store.aclose()


async def test_redis_heartbeats_carry_stats_and_beats_without_them_still_count(redis_url):
    flushdb(redis_url)
    store = RedisHeartbeats(redis_url)
    try:
        stats = book_with([("success", 8, 0.003)]).to_wire()
        await store.beat("w1", {"add_sub": (1,)}, 5.0, stats)
        await store.beat("w2", {"add_sub": (1,)}, 5.0)
        beats = await store.beats()
        assert beats["w1"].stats == stats and beats["w2"].stats is None
        assert await store.live() == {"w1": {"add_sub": (1,)}, "w2": {"add_sub": (1,)}}
    finally:
        await store.aclose()
        flushdb(redis_url)
