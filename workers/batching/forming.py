"""Deciding when to cut a batch. Pure: no asyncio, no clock of its own.

Requests wait in a ``BatchQueue``; ``take(now)`` returns the next batch when the
policy says one is due (full, a preferred size reached, or the oldest request
has waited ``max_queue_delay_s``), else None and ``next_due(now)`` says when to
ask again. Only requests with the same ``key`` (same input shapes past dim 0)
are batched together; a higher priority (a lower level number, as in Triton)
goes first.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    max_batch_size: int = 0
    preferred_sizes: tuple[int, ...] = ()
    max_queue_delay_s: float = 0.0

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    @property
    def cuts_alone(self) -> bool:
        """Whether a request that finds nothing waiting is a batch of its own at once
        (no batching, or no queue delay to wait for batch-mates)."""
        return not self.batching or self.max_queue_delay_s <= 0


@dataclass(slots=True)
class Pending(Generic[T]):
    item: T
    rows: int
    key: Hashable
    arrived: float
    priority: int = 0
    deadline: float | None = None
    order: int = field(default=0)


class BatchQueue(Generic[T]):
    def __init__(self, policy: BatchPolicy) -> None:
        self._policy = policy
        self._waiting: list[Pending[T]] = []
        self._order = 0

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, pending: Pending[T]) -> None:
        self._order += 1
        pending.order = self._order
        self._waiting.append(pending)
        # The list stays sorted by (priority, arrival); only a jump ahead re-sorts.
        if len(self._waiting) > 1 and pending.priority < self._waiting[-2].priority:
            self._waiting.sort(key=lambda p: (p.priority, p.order))

    def expired(self, now: float) -> list[Pending[T]]:
        """Remove and return the requests whose deadline has passed."""
        late = [p for p in self._waiting if p.deadline is not None and p.deadline <= now]
        if late:
            self._remove(late)
        return late

    def drain(self) -> list[Pending[T]]:
        waiting, self._waiting = self._waiting, []
        return waiting

    def take(self, now: float) -> list[Pending[T]] | None:
        if not self._waiting:
            return None
        if not self._policy.batching:
            return [self._waiting.pop(0)]
        chosen, more_fit_none = self._candidates()
        rows = sum(p.rows for p in chosen)
        if more_fit_none or rows >= self._policy.max_batch_size or self._delay_over(now):
            return self._remove(chosen)
        preferred = self._preferred_prefix(chosen)
        if preferred:
            return self._remove(preferred)
        if not self._policy.preferred_sizes and self._policy.max_queue_delay_s <= 0:
            return self._remove(chosen)
        return None

    def next_due(self, now: float) -> float | None:
        """When the oldest request's queue delay runs out, or the nearest deadline."""
        if not self._waiting:
            return None
        times = [min(p.arrived for p in self._waiting) + self._policy.max_queue_delay_s]
        times += [p.deadline for p in self._waiting if p.deadline is not None]
        return min(times)

    def _candidates(self) -> tuple[list[Pending[T]], bool]:
        """The head's batch-mates in order, and whether a compatible request
        was left out because it did not fit (so the batch is as full as it gets)."""
        head = self._waiting[0]
        limit = self._policy.max_batch_size
        chosen: list[Pending[T]] = []
        rows = 0
        for pending in self._waiting:
            if pending.key != head.key:
                continue
            if rows + pending.rows > limit:
                return chosen or [head], True
            chosen.append(pending)
            rows += pending.rows
        return chosen, False

    def _preferred_prefix(self, chosen: list[Pending[T]]) -> list[Pending[T]] | None:
        sizes = set(self._policy.preferred_sizes)
        best: list[Pending[T]] | None = None
        rows = 0
        for index, pending in enumerate(chosen):
            rows += pending.rows
            if rows in sizes:
                best = chosen[: index + 1]
        return best

    def _delay_over(self, now: float) -> bool:
        oldest = min(p.arrived for p in self._waiting)
        return now - oldest >= self._policy.max_queue_delay_s

    def _remove(self, batch: list[Pending[T]]) -> list[Pending[T]]:
        taken = {id(p) for p in batch}
        self._waiting = [p for p in self._waiting if id(p) not in taken]
        return batch
