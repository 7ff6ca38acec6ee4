"""The Redis session store against a real redis-server: checkpoints round-trip,
a sequence known without one is LOST, and a worker forgets a sequence's keys
only while they are still its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio as aioredis

from broker import channels
from tests.redis_server import flushdb
from tests.workers.sequences.accumulator import write_accumulator
from workers.repository.config import ModelConfig
from workers.repository.config_file import parse_config_file
from workers.sequences.sessions_redis import RedisSessions
from workers.sequences.state import LOST, Checkpoint


def config(tmp_path: Path, checkpoint: str = "true") -> ModelConfig:
    write_accumulator(tmp_path, parameters={"checkpoint_state": checkpoint})
    return parse_config_file(tmp_path / "accumulator" / "config.pbtxt")


@pytest.fixture
async def sessions(redis_url: str) -> AsyncIterator[tuple[RedisSessions, RedisSessions]]:
    flushdb(redis_url)

    async def nobody() -> set[str]:
        return set()

    first, second = RedisSessions(redis_url, "w1", nobody), RedisSessions(redis_url, "w2", nobody)
    yield first, second
    await first.aclose()
    await second.aclose()
    flushdb(redis_url)


async def test_a_checkpoint_round_trips_and_an_unknown_sequence_is_none(sessions, tmp_path: Path) -> None:
    store = sessions[0].state_store(config(tmp_path))
    state = {"ACC_IN": np.array([[41]], np.int64)}
    await store.begin(7)
    await store.save([(7, Checkpoint(state, "req-3", {"SUM": np.array([[41]], np.int64)}))])
    loaded = await store.load(7)
    assert isinstance(loaded, Checkpoint) and loaded.last_request == "req-3"
    np.testing.assert_array_equal(loaded.state["ACC_IN"], state["ACC_IN"])
    assert await store.load("7") is None  # a string id is another sequence


async def test_without_checkpoints_a_known_sequence_is_lost(sessions, tmp_path: Path) -> None:
    store = sessions[0].state_store(config(tmp_path, checkpoint="false"))
    await store.begin(8)
    await store.save([(8, Checkpoint({"ACC_IN": np.zeros((1, 1), np.int64)}))])
    assert await store.load(8) is LOST


async def test_a_worker_forgets_only_the_sequences_it_still_holds(sessions, tmp_path: Path, redis_url: str) -> None:
    cfg = config(tmp_path)
    old, new = sessions[0].state_store(cfg), sessions[1].state_store(cfg)
    await old.begin(9)
    await new.begin(9)  # started again on the other worker
    await new.save([(9, Checkpoint({"ACC_IN": np.ones((1, 1), np.int64)}))])
    await old.drop(9)  # the first worker's copy idles out
    assert isinstance(await new.load(9), Checkpoint)
    async with aioredis.Redis.from_url(redis_url) as client:
        home = await client.get(channels.session_key("accumulator", 9))
    assert home == channels.session_channel("accumulator", "w2").encode()
    await new.drop(9)
    assert await new.load(9) is None


async def test_a_session_channel_is_adopted_only_after_its_owner_stayed_gone_and_given_back_when_it_returns(
    redis_url: str,
) -> None:
    flushdb(redis_url)
    live = {"w1", "w2"}

    async def live_workers() -> set[str]:
        return set(live)

    orphaned = channels.session_channel("accumulator", "w2")
    async with aioredis.Redis.from_url(redis_url) as client:
        await client.xadd(orphaned, {"d": b"step"})
    sessions = RedisSessions(redis_url, "w1", live_workers, orphan_grace_s=0.3)
    try:
        assert await sessions.maintain(["accumulator"]) == {}
        live.discard("w2")  # its heartbeat lapses...
        assert await sessions.maintain(["accumulator"]) == {}  # ...not for long enough yet
        live.add("w2")
        await asyncio.sleep(0.4)
        assert await sessions.maintain(["accumulator"]) == {}  # it came back: the wait starts over
        live.discard("w2")
        assert await sessions.maintain(["accumulator"]) == {}
        await asyncio.sleep(0.4)
        assert await sessions.maintain(["accumulator"]) == {"accumulator": [orphaned]}
        assert orphaned in sessions.channels("accumulator")
        live.add("w2")  # only late after all: w1 stops reading its channel
        assert await sessions.maintain(["accumulator"]) == {}
        assert sessions.channels("accumulator") == (channels.session_channel("accumulator", "w1"),)
        async with aioredis.Redis.from_url(redis_url) as client:
            assert not await client.exists(channels.adopter_key(orphaned))
    finally:
        await sessions.aclose()
        flushdb(redis_url)
