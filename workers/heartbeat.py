"""Heartbeats: each worker says, every ``interval_s``, which models it serves.

A heartbeat is a key per worker, ``ferry.heartbeat.<worker_id>``, holding a
msgpack map and expiring after ``ttl_s`` (a few intervals). Any gateway can
read every live worker's key without consuming a stream meant for others; a
worker that dies simply stops refreshing its key and drops out when it
expires. A clean exit deletes the key at once.

In one process (``ferry serve`` on the memory broker) nothing is published:
the gateway asks the local worker directly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import msgpack
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from broker import channels
from broker.errors import TransportError, translated

log = structlog.get_logger("ferry.heartbeat")

ServedModels = dict[str, tuple[int, ...]]
SCAN_BATCH = 256


@dataclass(frozen=True, slots=True)
class HeartbeatSettings:
    interval_s: float = 1.0
    ttl_intervals: float = 3.0

    @property
    def ttl_s(self) -> float:
        return self.interval_s * self.ttl_intervals


class HeartbeatStore(Protocol):
    async def beat(self, worker_id: str, models: ServedModels, ttl_s: float) -> None: ...

    async def remove(self, worker_id: str) -> None: ...

    async def live(self) -> dict[str, ServedModels]:
        """Every live worker's id and the models and versions it serves."""

    async def aclose(self) -> None: ...


def encode_heartbeat(worker_id: str, models: ServedModels, sent_ns: int, ttl_s: float = 0.0) -> bytes:
    return msgpack.packb({
        "v": 1,
        "kind": "heartbeat",
        "worker": worker_id,
        "models": {name: list(versions) for name, versions in models.items()},
        "sent_ns": sent_ns,
        "ttl_ms": round(ttl_s * 1000),
    }, use_bin_type=True)


def heartbeat_expiry_ns(raw: bytes) -> int:
    """When a heartbeat stops counting: ``sent_ns`` plus its TTL (0 if unreadable)."""
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
        sent, ttl_ms = body["sent_ns"], body["ttl_ms"]
    except Exception:  # msgpack raises many types for corrupt input; a missing field is KeyError
        return 0
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (sent, ttl_ms)):
        return 0
    return int(sent + ttl_ms * 1_000_000)


def decode_heartbeat(raw: bytes) -> tuple[str, ServedModels] | None:
    """(worker id, models) or None when ``raw`` is not a heartbeat we understand."""
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception:  # msgpack raises many types for corrupt input
        return None
    if not isinstance(body, dict) or body.get("v") != 1 or body.get("kind") != "heartbeat":
        return None
    worker, models = body.get("worker"), body.get("models")
    if not isinstance(worker, str) or not isinstance(models, dict):
        return None
    served: ServedModels = {}
    for name, versions in models.items():
        if isinstance(name, str) and isinstance(versions, list):
            served[name] = tuple(v for v in versions if isinstance(v, int) and not isinstance(v, bool))
    return worker, served


class RedisHeartbeats:
    def __init__(self, url: str, prefix: str = channels.PREFIX) -> None:
        self._redis = aioredis.Redis.from_url(url, protocol=2)
        self._prefix = prefix

    async def beat(self, worker_id: str, models: ServedModels, ttl_s: float) -> None:
        raw = encode_heartbeat(worker_id, models, time.time_ns())
        with translated(RedisError, "redis"):
            await self._redis.set(channels.heartbeat_key(worker_id, self._prefix), raw,
                                  px=max(1, round(ttl_s * 1000)))

    async def remove(self, worker_id: str) -> None:
        with translated(RedisError, "redis"):
            await self._redis.delete(channels.heartbeat_key(worker_id, self._prefix))

    async def live(self) -> dict[str, ServedModels]:
        with translated(RedisError, "redis"):
            keys = [key async for key in self._redis.scan_iter(
                match=channels.heartbeat_pattern(self._prefix), count=SCAN_BATCH)]
            values = await self._redis.mget(keys) if keys else []
        found = (decode_heartbeat(raw) for raw in values if raw is not None)
        return {worker: models for worker, models in (f for f in found if f is not None)}

    async def aclose(self) -> None:
        await self._redis.aclose()


class Heartbeat:
    """Publishes one worker's heartbeat until ``aclose``, which deletes it."""

    def __init__(
        self,
        store: HeartbeatStore,
        worker_id: str,
        served: Callable[[], ServedModels],
        settings: HeartbeatSettings = HeartbeatSettings(),
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._served = served
        self._settings = settings
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._beat()
        self._task = asyncio.create_task(self._loop(), name="heartbeat")

    async def aclose(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        try:
            await self._store.remove(self._worker_id)
        except TransportError as exc:
            log.warning("heartbeat.remove_failed", worker=self._worker_id, error=str(exc))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.interval_s)
            try:
                await self._beat()
            except TransportError as exc:
                log.warning("heartbeat.failed", worker=self._worker_id, error=str(exc))

    async def _beat(self) -> None:
        await self._store.beat(self._worker_id, self._served(), self._settings.ttl_s)
