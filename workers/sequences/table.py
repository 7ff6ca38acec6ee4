"""Which sequence steps run next. Pure: no asyncio, no clock of its own.

A sequence is *active* from its first step until its END step has run or it
has been idle for ``idle_s``. Its steps run one at a time, in arrival order.

- ``direct``: each active sequence holds a batch slot of one instance for its
  whole life; a batch for an instance has a row per slot up to the highest
  slot with a ready step, and the rows in between are padding (READY false).
  Sequences beyond the slots wait in a backlog for a slot to free.
- ``oldest``: no slots; a batch takes the oldest ready step of up to
  ``max_batch_size`` of the ``max_candidate_sequences`` oldest sequences, on
  any free instance.

Only steps with the same batch key (input shapes) share a batch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from workers.sequences.config import SequenceBatching

T = TypeVar("T")
SequenceId = int | str


@dataclass(frozen=True, slots=True)
class SequencePolicy:
    strategy: Literal["direct", "oldest"] = "direct"
    instances: int = 1
    rows: int = 1  # rows per batch: max_batch_size, or 1 for a model without batching
    idle_s: float = 1.0
    delay_s: float = 0.0
    preferred_sizes: tuple[int, ...] = ()
    max_candidates: int = 0  # 0: every active sequence is a candidate

    @classmethod
    def of(cls, batching: SequenceBatching, max_batch_size: int, instances: int) -> SequencePolicy:
        oldest = batching.oldest
        return cls(
            strategy=batching.strategy,
            instances=max(1, instances),
            rows=max(1, max_batch_size),
            idle_s=batching.idle_s,
            delay_s=batching.queue_delay_s,
            preferred_sizes=tuple(oldest.preferred_batch_size) if oldest else (),
            max_candidates=oldest.max_candidate_sequences if oldest else 0,
        )

    @property
    def slots(self) -> int:
        return self.instances * self.rows


@dataclass(slots=True)
class Step(Generic[T]):
    sequence_id: SequenceId
    item: T
    key: Hashable
    arrived: float


@dataclass(slots=True)
class Sequence(Generic[T]):
    sequence_id: SequenceId
    order: int
    last_seen: float
    slot: int | None = None
    running: bool = False
    steps: deque[Step[T]] = field(default_factory=deque)
    state: Any = None  # the driver's implicit state for this sequence
    last: tuple[str, Any] = ("", None)  # the driver's last step: (request id, outputs)

    @property
    def ready(self) -> bool:
        return bool(self.steps) and not self.running


@dataclass(frozen=True, slots=True)
class Batch(Generic[T]):
    instance: int
    rows: tuple[Step[T] | None, ...]  # None: a padding row (direct only)

    @property
    def steps(self) -> list[Step[T]]:
        return [row for row in self.rows if row is not None]


class SequenceTable(Generic[T]):
    def __init__(self, policy: SequencePolicy) -> None:
        self.policy = policy
        self._active: dict[SequenceId, Sequence[T]] = {}
        self._slots: list[SequenceId | None] = [None] * policy.slots
        self._backlog: deque[SequenceId] = deque()
        self._busy: set[int] = set()
        self._order = 0
        self._next_instance = 0

    def __contains__(self, sequence_id: SequenceId) -> bool:
        return sequence_id in self._active

    def __len__(self) -> int:
        return len(self._active)

    def get(self, sequence_id: SequenceId) -> Sequence[T] | None:
        return self._active.get(sequence_id)

    def activate(self, sequence_id: SequenceId, now: float) -> Sequence[T]:
        self._order += 1
        record = Sequence[T](sequence_id, self._order, now)
        self._active[sequence_id] = record
        if self.policy.strategy == "direct":
            self._backlog.append(sequence_id)
            self._fill_slots()
        return record

    def add(self, step: Step[T]) -> None:
        record = self._active[step.sequence_id]
        record.steps.append(step)
        record.last_seen = step.arrived

    def release(self, sequence_id: SequenceId) -> None:
        """Forget a sequence (ended or idle) and give its slot to the backlog."""
        record = self._active.pop(sequence_id, None)
        if record is None:
            return
        if record.slot is not None:
            self._slots[record.slot] = None
        elif sequence_id in self._backlog:
            self._backlog.remove(sequence_id)
        self._fill_slots()

    def expire(self, now: float) -> list[SequenceId]:
        """Release and return the sequences idle for ``idle_s`` with nothing queued or running."""
        idle = [s.sequence_id for s in self._active.values()
                if not s.steps and not s.running and now - s.last_seen >= self.policy.idle_s]
        for sequence_id in idle:
            self.release(sequence_id)
        return idle

    def take(self, now: float) -> Batch[T] | None:
        """The next batch due, marking its instance busy and its sequences running."""
        batch = self._take_direct(now) if self.policy.strategy == "direct" else self._take_oldest(now)
        if batch is not None:
            self._busy.add(batch.instance)
            for step in batch.steps:
                record = self._active[step.sequence_id]
                record.steps.popleft()
                record.running = True
        return batch

    def finish(self, batch: Batch[T], now: float) -> None:
        self._busy.discard(batch.instance)
        for step in batch.steps:
            record = self._active.get(step.sequence_id)
            if record is not None:
                record.running = False
                record.last_seen = now

    def next_due(self, now: float) -> float | None:
        """When a waiting batch's queue delay runs out, or a sequence goes idle.

        A step whose instance is busy has no time here: the batch that ends
        wakes the driver (else its loop would spin until then)."""
        times = [s.steps[0].arrived + self.policy.delay_s for s in self._active.values()
                 if s.ready and self._may_run(s)]
        times += [s.last_seen + self.policy.idle_s for s in self._active.values()
                  if not s.steps and not s.running]
        return min(times, default=None)

    def _may_run(self, record: Sequence[T]) -> bool:
        """Whether an instance that may take the sequence's next step is free."""
        if self.policy.strategy == "direct":
            return record.slot is not None and record.slot // self.policy.rows not in self._busy
        return len(self._busy) < self.policy.instances

    def _fill_slots(self) -> None:
        while self._backlog and None in self._slots:
            sequence_id = self._backlog.popleft()
            slot = self._free_slot()
            self._slots[slot] = sequence_id
            self._active[sequence_id].slot = slot

    def _free_slot(self) -> int:
        """The lowest free slot of the instance holding the fewest sequences,
        so sequences spread over the instances rather than queue on one."""
        rows = self.policy.rows
        held = [sum(s is not None for s in self._slots[i * rows:(i + 1) * rows]) for i in range(self.policy.instances)]
        instance = min((i for i in range(self.policy.instances) if held[i] < rows), key=lambda i: held[i])
        return self._slots.index(None, instance * rows, (instance + 1) * rows)

    def _take_direct(self, now: float) -> Batch[T] | None:
        rows = self.policy.rows
        for offset in range(self.policy.instances):
            instance = (self._next_instance + offset) % self.policy.instances
            if instance in self._busy:
                continue
            held = [self._active[s] if s is not None else None for s in self._slots[instance * rows:(instance + 1) * rows]]
            chosen = _same_key([s for s in held if s is not None and s.ready])
            if not chosen or not self._due(chosen, [s for s in held if s is not None], now):
                continue
            self._next_instance = instance + 1
            picked = {id(s) for s in chosen}
            last = max(held.index(s) for s in chosen)
            return Batch(instance, tuple(s.steps[0] if s is not None and id(s) in picked else None
                                         for s in held[:last + 1]))
        return None

    def _take_oldest(self, now: float) -> Batch[T] | None:
        free = [i for i in range(self.policy.instances) if i not in self._busy]
        if not free:
            return None
        candidates = sorted(self._active.values(), key=lambda s: s.order)
        if self.policy.max_candidates > 0:
            candidates = candidates[: self.policy.max_candidates]
        ready = sorted((s for s in candidates if s.ready), key=lambda s: s.steps[0].arrived)
        chosen = _same_key(ready)[: self.policy.rows]
        if not chosen or not self._due(chosen, candidates, now):
            return None
        preferred = [size for size in self.policy.preferred_sizes if size <= len(chosen)]
        if preferred and len(chosen) < self.policy.rows and not self._delay_over(chosen, now):
            chosen = chosen[: max(preferred)]
        return Batch(free[0], tuple(s.steps[0] for s in chosen))

    def _due(self, chosen: list[Sequence[T]], members: list[Sequence[T]], now: float) -> bool:
        """Cut now if the batch is full, has reached a preferred size, every
        member is ready, or the oldest step has waited the queue delay."""
        if len(chosen) >= self.policy.rows or any(size <= len(chosen) for size in self.policy.preferred_sizes):
            return True
        if self.policy.delay_s <= 0 or self._delay_over(chosen, now):
            return True
        return len(chosen) == len(members)

    def _delay_over(self, chosen: list[Sequence[T]], now: float) -> bool:
        return now - min(s.steps[0].arrived for s in chosen) >= self.policy.delay_s


def _same_key(ready: list[Sequence[T]]) -> list[Sequence[T]]:
    """The ready sequences whose next step shares the oldest ready step's key."""
    if not ready:
        return []
    oldest = min(ready, key=lambda s: s.steps[0].arrived)
    return [s for s in ready if s.steps[0].key == oldest.steps[0].key]
