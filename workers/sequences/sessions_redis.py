"""Session routing for a Redis fleet: ownership, forwarding, checkpoints, adoption.

Keys (names in ``broker.channels``):

- ``<p>.<model>.session.<id>``: the session channel of the worker holding a
  live sequence, set when its START step runs here and deleted when it ends
  or idles out. It outlives the worker, which is how a later step tells a
  *lost* sequence from one that never started.
- ``<p>.<model>.state.<id>``: the sequence's checkpoint (msgpack: state
  tensors, and the id and outputs of the step that made it), written after
  every step unless the model's parameters set ``checkpoint_state`` to ``"false"``.
- ``<session channel>.adopter``: the live worker serving a dead worker's
  session channel, a lease refreshed every maintenance round.

A worker counts as dead once its heartbeat has been missing for ``orphan_grace_s``
(a heartbeat can lapse for a moment on a starved host; two workers reading one
session channel would split a sequence's steps between them), and an adopter
gives the channel back as soon as its owner heartbeats again.

A step that reaches a worker on a model's shared request channel is handled
there if it starts a sequence (the worker becomes its home) or if its
sequence is unknown (the sequence batcher then explains why), and is
forwarded to its home's session channel otherwise. When a worker dies,
another adopts its session channel: it claims the entries left pending
there, then reads the channel as its own, resuming each sequence from its
checkpoint, or answering "session lost" where there is none.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable

import msgpack
import structlog

from broker import channels
from broker.envelope import Request, SequenceId
from broker.errors import translated
from broker.redis_url import REDIS_ERRORS, AsyncRedis, async_client
from workers.repository.config import ModelConfig
from workers.sequences.sessions import HERE, Route
from workers.sequences.state import LOST, Checkpoint, Lost, StateStore, pack_tensors, unpack_tensors

log = structlog.get_logger("ferry.sessions")

LiveWorkers = Callable[[], Awaitable[set[str]]]
SCAN_BATCH = 256
MIN_KEY_TTL_S = 60.0
ORPHAN_GRACE_S = 2.0


class RedisSessions:
    def __init__(self, url: str, worker_id: str, live_workers: LiveWorkers, lease_s: float = 5.0,
                 prefix: str = channels.PREFIX, forwarding: bool = True,
                 orphan_grace_s: float = ORPHAN_GRACE_S) -> None:
        """``forwarding=False`` keeps only the state store, for a broker that
        routes sequences itself (Kafka's partition key)."""
        self._forwarding = forwarding
        self._redis = async_client(url)
        self._worker_id = worker_id
        self._live_workers = live_workers
        self._lease_ms = max(1, round(lease_s * 1000))
        self._prefix = prefix
        self._adopted: dict[str, set[str]] = {}
        self._orphan_grace_s = orphan_grace_s
        self._missing_since: dict[str, float] = {}  # channel -> when its owner was first seen gone

    def channels(self, model: str) -> tuple[str, ...]:
        if not self._forwarding:
            return ()
        own = channels.session_channel(model, self._worker_id, self._prefix)
        return (own, *sorted(self._adopted.get(model, ())))

    async def route(self, model: str, request: Request, channel: str) -> Route:
        sequence_id = request.sequence_id
        if sequence_id is None or not self._forwarding:
            return HERE
        own = channels.session_channel(model, self._worker_id, self._prefix)
        if channel in self.channels(model):
            return Route(home=own if request.sequence_start else channel)
        with translated(REDIS_ERRORS, "redis"):
            home = await self._redis.get(channels.session_key(model, sequence_id, self._prefix))
        if home is None:
            return Route(home=own) if request.sequence_start else HERE
        home_channel = _text(home)
        if home_channel in self.channels(model):
            return Route(home=own if request.sequence_start else home_channel)
        # A live sequence's id started again goes to its home too, which restarts it there.
        return Route(forward_to=home_channel, home=home_channel)

    def state_store(self, config: ModelConfig) -> StateStore:
        model = config.name
        home = channels.session_channel(model, self._worker_id, self._prefix)
        idle_s = config.sequence_batching.idle_s if config.sequence_batching else 0.0
        return RedisStates(self._redis, model, home, lambda: self.channels(model), checkpointing(config),
                           max(MIN_KEY_TTL_S, 2 * idle_s), self._prefix)

    async def maintain(self, models: Iterable[str]) -> dict[str, list[str]]:
        if not self._forwarding:
            return {}
        live = await self._live_workers()
        adopted: dict[str, list[str]] = {}
        orphans: set[str] = set()
        for model in models:
            await self._renew(model, live)
            for channel in await self._orphans(model, live):
                orphans.add(channel)
                if self._gone_long_enough(channel) and await self._adopt(channel):
                    self._adopted.setdefault(model, set()).add(channel)
                    adopted.setdefault(model, []).append(channel)
                    log.info("sessions.adopted", model=model, channel=channel, worker_id=self._worker_id)
        self._missing_since = {c: t for c, t in self._missing_since.items() if c in orphans}
        return adopted

    def _gone_long_enough(self, channel: str) -> bool:
        now = time.monotonic()
        return now - self._missing_since.setdefault(channel, now) >= self._orphan_grace_s

    async def aclose(self) -> None:
        with translated(REDIS_ERRORS, "redis"):
            for channel in {c for held in self._adopted.values() for c in held}:
                await self._redis.delete(channels.adopter_key(channel))
        await self._redis.aclose()

    async def _renew(self, model: str, live: set[str]) -> None:
        with translated(REDIS_ERRORS, "redis"):
            for channel in list(self._adopted.get(model, ())):
                key = channels.adopter_key(channel)
                holder = await self._redis.get(key)
                if holder is not None and _text(holder) != self._worker_id:
                    self._adopted[model].discard(channel)  # our lease lapsed and another took it
                    continue
                if channels.session_channel_owner(channel, model, self._prefix) in live:
                    # Its owner was only late: it reads its channel again, so we stop.
                    self._adopted[model].discard(channel)
                    await self._redis.delete(key)
                    log.info("sessions.returned", model=model, channel=channel, worker_id=self._worker_id)
                    continue
                await self._redis.set(key, self._worker_id, px=self._lease_ms)

    async def _orphans(self, model: str, live: set[str]) -> list[str]:
        """Session channels of workers that are no longer live, not yet adopted by us."""
        pattern = channels.session_channel_pattern(model, self._prefix)
        found: list[str] = []
        with translated(REDIS_ERRORS, "redis"):
            async for raw in self._redis.scan_iter(match=pattern, count=SCAN_BATCH, _type="stream"):
                channel = raw.decode()
                owner = channels.session_channel_owner(channel, model, self._prefix)
                if owner and owner not in live and owner != self._worker_id \
                        and channel not in self._adopted.get(model, ()):
                    found.append(channel)
        return found

    async def _adopt(self, channel: str) -> bool:
        with translated(REDIS_ERRORS, "redis"):
            key = channels.adopter_key(channel)
            if await self._redis.set(key, self._worker_id, px=self._lease_ms, nx=True):
                return True
            holder = await self._redis.get(key)
        return holder is not None and _text(holder) == self._worker_id


def checkpointing(config: ModelConfig) -> bool:
    value = config.parameters.get("checkpoint_state", "true").strip().lower()
    return value not in ("false", "0", "no", "off")


# Forget a sequence only while it is still ours: after a restart on another
# worker, the keys are that worker's.
_DROP_IF_HELD = """
local home = redis.call('GET', KEYS[1])
for _, mine in ipairs(ARGV) do
  if home == mine then return redis.call('DEL', KEYS[1], KEYS[2]) end
end
return 0
"""


class RedisStates:
    """One model's ``StateStore`` on Redis."""

    def __init__(self, redis: AsyncRedis, model: str, home: str, held: Callable[[], tuple[str, ...]],
                 checkpointing: bool, ttl_s: float, prefix: str) -> None:
        self._redis = redis
        self._model = model
        self._home = home
        self._held = held
        self._drop_if_held = redis.register_script(_DROP_IF_HELD)
        self._checkpointing = checkpointing
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._prefix = prefix

    async def load(self, sequence_id: SequenceId) -> Checkpoint | Lost | None:
        with translated(REDIS_ERRORS, "redis"):
            raw, home = await self._redis.mget([self._state_key(sequence_id), self._session_key(sequence_id)])
        if isinstance(raw, bytes):
            return _decode_checkpoint(raw)
        return LOST if home is not None else None

    async def begin(self, sequence_id: SequenceId) -> None:
        with translated(REDIS_ERRORS, "redis"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.set(self._session_key(sequence_id), self._home, px=self._ttl_ms)
            pipe.delete(self._state_key(sequence_id))
            await pipe.execute()

    async def save(self, checkpoints: list[tuple[SequenceId, Checkpoint]]) -> None:
        with translated(REDIS_ERRORS, "redis"):
            pipe = self._redis.pipeline(transaction=False)
            for sequence_id, checkpoint in checkpoints:
                pipe.pexpire(self._session_key(sequence_id), self._ttl_ms)
                if self._checkpointing:
                    pipe.set(self._state_key(sequence_id), _encode_checkpoint(checkpoint), px=self._ttl_ms)
            await pipe.execute()

    async def drop(self, sequence_id: SequenceId) -> None:
        with translated(REDIS_ERRORS, "redis"):
            await self._drop_if_held(keys=[self._session_key(sequence_id), self._state_key(sequence_id)],
                                     args=list(self._held()))

    def _session_key(self, sequence_id: SequenceId) -> str:
        return channels.session_key(self._model, sequence_id, self._prefix)

    def _state_key(self, sequence_id: SequenceId) -> str:
        return channels.state_key(self._model, sequence_id, self._prefix)


def _encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    outputs = None if checkpoint.last_outputs is None else pack_tensors(checkpoint.last_outputs)
    return msgpack.packb({"v": 1, "state": pack_tensors(checkpoint.state),
                          "last_request": checkpoint.last_request, "last_outputs": outputs})


def _text(value: bytes | str) -> str:
    # redis-py types a reply as bytes or str; this client does not decode, so it is bytes.
    return value.decode() if isinstance(value, bytes) else value


def _decode_checkpoint(raw: bytes) -> Checkpoint:
    body = msgpack.unpackb(raw, raw=False)
    outputs = body.get("last_outputs")
    return Checkpoint(unpack_tensors(body["state"]), body.get("last_request", ""),
                      None if outputs is None else unpack_tensors(outputs))
