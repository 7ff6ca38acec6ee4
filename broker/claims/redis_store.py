"""Claim-checked bytes in Redis: one key per tensor, with a TTL.

Keys carry no hash tag, so a Redis Cluster spreads the bytes over its shards.
Each call's commands go out together (``broker.redis_pipe``: one write per master, however
many tensors a message has), a tensor handed to the socket uncopied (one under 1 MB on a
connection of its own, so several go at once): redis-py's packer copies it, at 4.5 ms for 4 MB.
A tensor is read on a connection of its own too, so that its bytes hold up no other reply.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Sequence

from broker import channels
from broker.claims.store import claim_id, process_tag
from broker.errors import ClaimMissing, translated
from broker.redis_pipe import pipes_for
from broker.redis_url import REDIS_ERRORS, async_client


_ID = re.compile(r"[0-9a-f]{32}")


class RedisClaims:
    scheme = "redis"

    def __init__(self, url: str, prefix: str = channels.PREFIX) -> None:
        self._redis = async_client(url)
        self._pipes = pipes_for(self._redis, large_alone=True)  # tensors wait on no other
        self._prefix = prefix
        self.owner = process_tag()

    def _key(self, claim: str) -> str:
        try:
            found = claim_id(claim, self.scheme)
        except ValueError as exc:
            raise ClaimMissing(str(exc)) from None
        if _ID.fullmatch(found) is None:  # a producer's claim names no other key
            raise ClaimMissing(f"claim '{claim[:80]}' does not name a ferry claim key")
        return channels.claim_key(found, self._prefix)

    async def put(self, blobs: Sequence[bytes | memoryview], ttl_s: float, owner: str) -> list[str]:
        """``owner`` is not kept: every blob has a TTL, and Redis does not know which processes live."""
        claims = [f"{self.scheme}:{uuid.uuid4().hex}" for _ in blobs]
        ttl_ms = max(1, int(ttl_s * 1000))
        keys = [self._key(claim) for claim in claims]
        with translated(REDIS_ERRORS, "redis claims"):
            await asyncio.gather(*(self._pipes.call_for(key, "SET", key, blob, "PX", ttl_ms)
                                   for key, blob in zip(keys, blobs)))
        return claims

    async def get(self, claims: Sequence[str], delete: bool = False) -> list[bytes]:
        keys = [self._key(claim) for claim in claims]
        verb = "GETDEL" if delete else "GET"
        with translated(REDIS_ERRORS, "redis claims"):
            found = await asyncio.gather(*(self._pipes.call_for(key, verb, key, alone=True) for key in keys))
        for claim, blob in zip(claims, found):
            if blob is None:
                raise ClaimMissing(f"claim '{claim}' is gone from Redis (expired, or deleted once answered)")
        return found

    async def delete(self, claims: Sequence[str]) -> None:
        if not claims:
            return
        keys = [self._key(claim) for claim in claims]
        with translated(REDIS_ERRORS, "redis claims"):
            # one DEL per key: in a Redis Cluster they live on different slots
            await asyncio.gather(*(self._pipes.call_for(key, "DEL", key) for key in keys))

    async def aclose(self) -> None:
        await self._pipes.aclose()
        await self._redis.aclose()
