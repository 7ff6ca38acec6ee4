"""Admission: refuse a request when its model's queue is full.

A model's queue is its request channels on the broker: what is waiting there
plus what workers hold and have not answered, summed over its priority
levels. It is shared by every gateway, so each gateway samples it from the
broker (``Backlog.backlog``) at most every ``refresh_s`` per model, and adds
what it has itself admitted since its last sample, or admitted and not yet
published (those a sample cannot have seen). A full queue (Triton's
``max_queue_size``, 0 meaning no limit) raises ``QueueFull``, which the HTTP
layer answers with 503 and ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from broker import channels
from broker.errors import TransportError
from gateway.errors import QueueFull
from workers.repository.config import ModelConfig

log = structlog.get_logger("ferry.gateway.admission")


class Backlog(Protocol):
    async def backlog(self, channel: str, group: str) -> tuple[int, int]:
        """(messages not yet delivered, delivered but not acked) for a group."""


@dataclass(slots=True)
class _Sample:
    depth: int = 0
    taken_at: float = -math.inf
    admitted_since: int = 0
    in_transit: int = 0  # admitted, not yet on the broker
    refreshing: asyncio.Future[None] | None = None


class QueueLimits:
    def __init__(self, broker: Backlog, prefix: str = channels.PREFIX, refresh_s: float = 0.05,
                 retry_after_s: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self._broker = broker
        self._prefix = prefix
        self._refresh_s = refresh_s
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._samples: dict[str, _Sample] = {}

    @contextlib.asynccontextmanager
    async def admission(self, model: str, config: ModelConfig) -> AsyncIterator[None]:
        """Admit one request to ``model`` (or raise QueueFull) for the block that publishes it."""
        limit = config.queue_policy.max_queue_size
        if limit <= 0:
            yield
            return
        sample = self._samples.setdefault(model, _Sample())
        if self._clock() - sample.taken_at >= self._refresh_s:
            await self._refresh(model, config, sample)
        if sample.depth + sample.admitted_since >= limit:
            raise QueueFull(f"the queue of model '{model}' is full ({limit} requests)", self._retry_after_s)
        sample.admitted_since += 1
        sample.in_transit += 1
        try:
            yield
        finally:
            sample.in_transit -= 1

    async def _refresh(self, model: str, config: ModelConfig, sample: _Sample) -> None:
        # One broker round trip per model at a time; concurrent callers share it.
        if sample.refreshing is not None:
            await asyncio.shield(sample.refreshing)
            return
        sample.refreshing = asyncio.get_running_loop().create_future()
        try:
            group = channels.worker_group(model, self._prefix)
            depth = 0
            for channel in channels.request_channels(model, config.priority_levels, self._prefix):
                waiting, held = await self._broker.backlog(channel, group)
                depth += waiting + held
            # What is still being published cannot be in the depth just read.
            sample.depth, sample.taken_at, sample.admitted_since = depth, self._clock(), sample.in_transit
        except TransportError as exc:
            # Fail open: a broker that cannot be read will refuse the publish itself.
            log.warning("admission.sample_failed", model=model, error=str(exc))
        finally:
            sample.refreshing.set_result(None)
            sample.refreshing = None
