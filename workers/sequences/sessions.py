"""Where a sequence's steps are handled: the session routing seam.

A stateful model's sequence lives on the one worker that holds its state.
``SessionRouting`` says, for each step a worker receives, whether to handle
it here or forward it to the session channel of the worker that holds it;
which session channels this worker reads (its own, and those it adopted from
dead workers); and which ``StateStore`` keeps each model's checkpoints.

``LocalSessions`` is the routing of one process (the memory broker) and of
Kafka, where the partition key already sends a sequence to one worker:
every step is handled here and state lives only in memory.
``workers.sequences.sessions_redis.RedisSessions`` routes a Redis fleet.

``SequenceLocks`` keeps one sequence's steps in arrival order inside a
worker (or a gateway): a step takes its sequence's lock before its first
await, and locks are granted first come, first served.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from broker.envelope import Request, SequenceId
from workers.repository.config import ModelConfig
from workers.sequences.state import LocalStates, StateStore


@dataclass(frozen=True, slots=True)
class Route:
    forward_to: str | None = None  # None: handle the step here
    home: str | None = None  # the session channel holding the sequence, for the reply to name


HERE = Route()
CHANNEL_PARAMETER = "sequence_channel"  # the reply parameter naming a sequence's session channel


class SessionRouting(Protocol):
    def channels(self, model: str) -> tuple[str, ...]:
        """Session channels this worker reads for ``model``, before its request channels."""

    async def route(self, model: str, request: Request, channel: str) -> Route: ...

    def state_store(self, config: ModelConfig) -> StateStore: ...

    async def maintain(self, models: Iterable[str]) -> dict[str, list[str]]:
        """Refresh leases and adopt dead workers' session channels; the
        channels newly adopted, by model."""

    async def aclose(self) -> None: ...


class LocalSessions:
    def channels(self, model: str) -> tuple[str, ...]:
        return ()

    async def route(self, model: str, request: Request, channel: str) -> Route:
        return HERE

    def state_store(self, config: ModelConfig) -> StateStore:
        return LocalStates()

    async def maintain(self, models: Iterable[str]) -> dict[str, list[str]]:
        return {}

    async def aclose(self) -> None:
        return None


class SequenceLocks:
    def __init__(self) -> None:
        self._locks: dict[tuple[str, SequenceId], tuple[asyncio.Lock, int]] = {}

    def hold(self, model: str, sequence_id: SequenceId) -> _Held:
        return _Held(self, (model, sequence_id))

    def _enter(self, key: tuple[str, SequenceId]) -> asyncio.Lock:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        return lock

    def _exit(self, key: tuple[str, SequenceId]) -> None:
        lock, users = self._locks[key]
        if users <= 1:
            del self._locks[key]
        else:
            self._locks[key] = (lock, users - 1)


class _Held:
    def __init__(self, locks: SequenceLocks, key: tuple[str, SequenceId]) -> None:
        self._locks = locks
        self._key = key
        # Counted now, not in __aenter__, so the lock outlives every step already waiting for it.
        self._lock = locks._enter(key)

    async def __aenter__(self) -> None:
        await self._lock.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()
        self._locks._exit(self._key)
