"""workers.cache.redis_cache on a real redis-server: an answer stored is found again, under its
TTL when there is one; a Redis that cannot be reached makes a miss and a store that does nothing,
never an error."""

from __future__ import annotations

import asyncio
import uuid

import redis

from tests.redis_server import free_port
from workers.cache.redis_cache import RedisCache


def test_an_answer_stored_is_found_again_and_expires_with_its_ttl(redis_url: str) -> None:
    key, answer = uuid.uuid4().bytes, bytes(range(256)) * 400  # 100 KB: sent uncopied

    async def scenario(ttl_s: float) -> tuple[bytes | None, bytes | None]:
        cache = RedisCache(redis_url, ttl_s=ttl_s, prefix="ferry.test")
        try:
            before = await cache.get(key)
            await cache.put(key, answer)
            return before, await cache.get(key)
        finally:
            await cache.aclose()

    assert asyncio.run(scenario(30.0)) == (None, answer)
    name = f"ferry.test.cache.{key.hex()}"
    with redis.Redis.from_url(redis_url) as client:
        assert 25_000 < client.pttl(name) <= 30_000
        client.delete(name)
    asyncio.run(scenario(0.0))
    with redis.Redis.from_url(redis_url) as client:
        assert client.pttl(name) == -1  # no TTL asked for, none set
        client.delete(name)


def test_a_redis_that_cannot_be_reached_makes_a_miss_not_an_error() -> None:
    async def scenario() -> bytes | None:
        cache = RedisCache(f"redis://127.0.0.1:{free_port()}/0", ttl_s=5)
        try:
            await cache.put(b"k", b"answer")
            return await cache.get(b"k")
        finally:
            await cache.aclose()

    assert asyncio.run(scenario()) is None
