"""Cached answers in Redis, shared by every worker of the fleet (Triton has a
Redis cache too). One key per answer, ``<prefix>.cache.<hex digest>``, with no
hash tag, so a Redis Cluster spreads them; an optional TTL; what Redis evicts
under ``maxmemory`` is Redis's policy. A Redis that cannot be reached makes a
miss, logged, never a failed request. Lookups and stores go out with those due at the
same time (``broker.redis_pipe``), an answer's bytes uncopied."""

from __future__ import annotations

import structlog

from broker import channels
from broker.redis_pipe import pipes_for
from broker.redis_url import REDIS_ERRORS, async_client

log = structlog.get_logger("ferry.cache")


class RedisCache:
    kind = "redis"

    def __init__(self, url: str, ttl_s: float = 0.0, prefix: str = channels.PREFIX) -> None:
        self._redis = async_client(url)
        self._pipes = pipes_for(self._redis)
        self._ttl_ms = int(ttl_s * 1000) if ttl_s > 0 else None
        self._prefix = prefix

    def key(self, key: bytes) -> str:
        return f"{self._prefix}.cache.{key.hex()}"

    async def get(self, key: bytes) -> bytes | None:
        try:
            name = self.key(key)
            found = await self._pipes.call_for(name, "GET", name)
        except REDIS_ERRORS as exc:
            log.warning("cache.unreadable", kind=self.kind, error=str(exc))
            return None
        return found if isinstance(found, bytes) else None

    async def put(self, key: bytes, value: bytes) -> None:
        try:
            name = self.key(key)
            expiry = ("PX", self._ttl_ms) if self._ttl_ms is not None else ()
            await self._pipes.call_for(name, "SET", name, value, *expiry)
        except REDIS_ERRORS as exc:
            log.warning("cache.unwritable", kind=self.kind, error=str(exc))

    async def aclose(self) -> None:
        await self._pipes.aclose()
        await self._redis.aclose()
