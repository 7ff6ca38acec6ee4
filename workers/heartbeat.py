"""Heartbeats: each worker says, every ``interval_s``, which models it serves.

A heartbeat is a key per worker, ``ferry.heartbeat.<worker_id>``, holding a
msgpack map and expiring after ``ttl_s`` (a few intervals). Any gateway can
read every live worker's key without consuming a stream meant for others; a
worker that dies simply stops refreshing its key and drops out when it
expires. A clean exit deletes the key at once.

A heartbeat may also carry the worker's ``StatsBook.to_wire()`` (``stats``),
so a gateway's dashboard can sum the fleet's throughput and latency. It is
optional (older heartbeats have none), dropped when it would make the
heartbeat larger than ``MAX_HEARTBEAT_BYTES``, and checked on decode
(``workers.telemetry.wire.parse_stats``): bad stats are ignored, the beat
still counts.

In one process (``ferry serve`` on the memory broker) nothing is published:
the gateway asks the local worker directly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack
import structlog

from broker import channels
from broker.errors import TransportError, translated
from broker.redis_url import REDIS_ERRORS, async_client
from workers.telemetry.wire import WorkerStats, parse_stats

log = structlog.get_logger("ferry.heartbeat")

ServedModels = Mapping[str, tuple[int, ...]]
SCAN_BATCH = 256
# Stats for a few hundred model versions fit; past this the beat goes without them.
MAX_HEARTBEAT_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class HeartbeatSettings:
    interval_s: float = 1.0
    ttl_intervals: float = 3.0

    @property
    def ttl_s(self) -> float:
        return self.interval_s * self.ttl_intervals


@dataclass(frozen=True, slots=True)
class Beat:
    """One worker's last heartbeat: what it serves and, if it sent them, its stats."""

    worker: str
    models: ServedModels
    stats: WorkerStats | None = None
    sent_ns: int = 0  # the worker's wall clock when it sent the beat


class HeartbeatStore(Protocol):
    async def beat(self, worker_id: str, models: ServedModels, ttl_s: float,
                   stats: WorkerStats | None = None) -> None: ...

    async def remove(self, worker_id: str) -> None: ...

    async def live(self) -> dict[str, ServedModels]:
        """Every live worker's id and the models and versions it serves."""

    async def beats(self) -> dict[str, Beat]:
        """Every live worker's last heartbeat, stats included."""

    async def aclose(self) -> None: ...


def encode_heartbeat(worker_id: str, models: ServedModels, sent_ns: int, ttl_s: float = 0.0,
                     stats: WorkerStats | None = None) -> bytes:
    body: dict[str, Any] = {
        "v": 1,
        "kind": "heartbeat",
        "worker": worker_id,
        "models": {name: list(versions) for name, versions in models.items()},
        "sent_ns": sent_ns,
        "ttl_ms": round(ttl_s * 1000),
    }
    if stats is None:
        return msgpack.packb(body, use_bin_type=True)
    raw = msgpack.packb({**body, "stats": stats}, use_bin_type=True)
    if len(raw) <= MAX_HEARTBEAT_BYTES:
        return raw
    log.warning("heartbeat.stats_dropped", worker_id=worker_id, size=len(raw), limit=MAX_HEARTBEAT_BYTES)
    return msgpack.packb(body, use_bin_type=True)


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
    beat = decode_beat(raw)
    return None if beat is None else (beat.worker, beat.models)


def decode_beat(raw: bytes) -> Beat | None:
    """The heartbeat in ``raw``, or None when it is not one we understand."""
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception:  # msgpack raises many types for corrupt input
        return None
    if not isinstance(body, dict) or body.get("v") != 1 or body.get("kind") != "heartbeat":
        return None
    worker, models = body.get("worker"), body.get("models")
    if not isinstance(worker, str) or not isinstance(models, dict):
        return None
    served: dict[str, tuple[int, ...]] = {}
    for name, versions in models.items():
        if isinstance(name, str) and isinstance(versions, list):
            served[name] = tuple(v for v in versions if isinstance(v, int) and not isinstance(v, bool))
    sent = body.get("sent_ns")
    sent_ns = sent if isinstance(sent, int) and not isinstance(sent, bool) else 0
    # Stats past the bound came from a writer that is not ferry's encoder: ignored, like bad ones.
    fits = len(raw) <= MAX_HEARTBEAT_BYTES
    return Beat(worker, served, parse_stats(body["stats"]) if "stats" in body and fits else None, sent_ns)


class RedisHeartbeats:
    def __init__(self, url: str, prefix: str = channels.PREFIX) -> None:
        self._redis = async_client(url)
        self._prefix = prefix

    async def beat(self, worker_id: str, models: ServedModels, ttl_s: float,
                   stats: WorkerStats | None = None) -> None:
        raw = encode_heartbeat(worker_id, models, time.time_ns(), stats=stats)
        with translated(REDIS_ERRORS, "redis"):
            await self._redis.set(channels.heartbeat_key(worker_id, self._prefix), raw,
                                  px=max(1, round(ttl_s * 1000)))

    async def remove(self, worker_id: str) -> None:
        with translated(REDIS_ERRORS, "redis"):
            await self._redis.delete(channels.heartbeat_key(worker_id, self._prefix))

    async def live(self) -> dict[str, ServedModels]:
        return {worker: beat.models for worker, beat in (await self.beats()).items()}

    async def beats(self) -> dict[str, Beat]:
        with translated(REDIS_ERRORS, "redis"):
            keys = [key async for key in self._redis.scan_iter(
                match=channels.heartbeat_pattern(self._prefix), count=SCAN_BATCH)]
            # One GET each in one pipeline: in a Redis Cluster the keys live on different slots.
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.get(key)
                values = await pipe.execute() if keys else []
        found = (decode_beat(raw) for raw in values if isinstance(raw, bytes))
        return {beat.worker: beat for beat in found if beat is not None}

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
        stats: Callable[[], WorkerStats] | None = None,
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._served = served
        self._settings = settings
        self._stats = stats
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
            log.warning("heartbeat.remove_failed", worker_id=self._worker_id, error=str(exc))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.interval_s)
            try:
                await self._beat()
            except TransportError as exc:
                log.warning("heartbeat.failed", worker_id=self._worker_id, error=str(exc))

    async def _beat(self) -> None:
        stats = None if self._stats is None else self._stats()
        await self._store.beat(self._worker_id, self._served(), self._settings.ttl_s, stats)
