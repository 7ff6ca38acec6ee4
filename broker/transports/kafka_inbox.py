"""What one Kafka group member has fetched but not yet committed.

Kafka remembers a group's progress as one offset per partition, so a message
counts as done only when it and every message before it in its partition are
acked. The inbox keeps, per partition, the fetched records in offset order,
each *buffered* (not yet handed to the application), *handed out*, or
*acked*; the acked prefix is popped, and the offset just after it is the
partition's commit point. Acks may arrive in any order; the commit point
never passes an unacked record.

Records are buffered per topic, so ``take`` can serve the first of several
topics that has any. A record handed out and left unacked for a while (its
handler failed, say, to publish a reply while the broker was away) can be
handed out again by ``stale``, one attempt higher, as Redis' XAUTOCLAIM
would; the partition's commit point waits for it all the while. Two threads use it (the member's poll thread adds and
drops records, the event loop takes and acks them), so every method holds
one lock; none of them does I/O.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum

from broker.transport import Delivery

Partition = tuple[str, int]


class State(Enum):
    BUFFERED = 1
    HANDED_OUT = 2
    ACKED = 3


@dataclass(frozen=True, slots=True)
class Record:
    partition: int
    offset: int
    delivery: Delivery

    @property
    def key(self) -> Partition:
        return self.delivery.channel, self.partition


@dataclass(slots=True)
class _Ledger:
    states: OrderedDict[int, State] = field(default_factory=OrderedDict)
    commit_point: int | None = None  # the offset after the acked prefix
    sent: int | None = None  # the last commit point handed to Kafka
    out: dict[int, tuple[float, Delivery]] = field(default_factory=dict)  # handed out, unacked: since when

    def pop_acked(self) -> None:
        while self.states:
            offset, state = next(iter(self.states.items()))
            if state is not State.ACKED:
                return
            del self.states[offset]
            self.commit_point = offset + 1


@dataclass(frozen=True, slots=True)
class LocalProgress:
    """This member's view of one topic, for ``backlog``."""

    commit_points: dict[int, int]
    in_flight: int  # handed out (acked or not) beyond the commit points
    pending: int  # handed out and not acked


class Inbox:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ledgers: dict[Partition, _Ledger] = {}
        self._buffers: dict[str, deque[Record]] = {}
        self._count = 0
        self._bytes = 0

    @property
    def buffered(self) -> tuple[int, int]:
        """(records, payload bytes) fetched and not yet handed out."""
        with self._lock:
            return self._count, self._bytes

    def add(self, records: Iterable[Record]) -> int:
        added = 0
        with self._lock:
            for record in records:
                ledger = self._ledgers.setdefault(record.key, _Ledger())
                if record.offset in ledger.states:
                    continue  # fetched again after a seek: the first copy stands
                ledger.states[record.offset] = State.BUFFERED
                self._buffers.setdefault(record.delivery.channel, deque()).append(record)
                self._count += 1
                self._bytes += len(record.delivery.payload)
                added += 1
        return added

    def take(self, channels: Sequence[str], max_count: int) -> list[Delivery]:
        """Up to ``max_count`` buffered deliveries from the first of ``channels`` that has any."""
        with self._lock:
            for channel in channels:
                buffer = self._buffers.get(channel)
                if buffer:
                    return self._take_from(buffer, max_count)
        return []

    def ack(self, channel: str, partition: int, offset: int) -> None:
        """Mark a handed-out record acked. One not handed out (unknown, dropped
        on revoke, or fetched again since) is left alone: it will be delivered
        (again), which at-least-once allows."""
        with self._lock:
            ledger = self._ledgers.get((channel, partition))
            if ledger is None or ledger.states.get(offset) is not State.HANDED_OUT:
                return
            ledger.states[offset] = State.ACKED
            del ledger.out[offset]
            ledger.pop_acked()

    def stale(self, channel: str, min_idle_s: float, max_count: int) -> list[Delivery]:
        """Up to ``max_count`` records of ``channel`` handed out at least
        ``min_idle_s`` ago and not acked, handed out again (idle time reset)
        with ``attempts`` one higher."""
        taken: list[Delivery] = []
        with self._lock:
            now = self._clock()
            for (topic, _), ledger in self._ledgers.items():
                if topic != channel:
                    continue
                for offset, (since, delivery) in ledger.out.items():
                    if len(taken) >= max_count:
                        return taken
                    if now - since >= min_idle_s:
                        again = replace(delivery, attempts=delivery.attempts + 1)
                        ledger.out[offset] = (now, again)
                        taken.append(again)
        return taken

    def due_commits(self, partitions: Iterable[Partition] | None = None) -> dict[Partition, int]:
        """Commit points that moved since they were last sent; marks them sent."""
        with self._lock:
            keys = self._ledgers.keys() if partitions is None else [p for p in partitions if p in self._ledgers]
            due: dict[Partition, int] = {}
            for key in keys:
                ledger = self._ledgers[key]
                if ledger.commit_point is not None and ledger.commit_point != ledger.sent:
                    due[key] = ledger.sent = ledger.commit_point
            return due

    def commit_failed(self, points: dict[Partition, int]) -> None:
        """Send these again next time (unless a later point has been sent since)."""
        with self._lock:
            for key, point in points.items():
                ledger = self._ledgers.get(key)
                if ledger is not None and ledger.sent == point:
                    ledger.sent = None

    def drop(self, partitions: Iterable[Partition]) -> dict[Partition, int]:
        """Forget partitions this member no longer owns, and return their
        last commit points. Buffered records of theirs are discarded; the
        partition's next owner reads them from the committed offset."""
        wanted = set(partitions)
        with self._lock:
            points = {
                key: ledger.commit_point for key, ledger in self._ledgers.items()
                if key in wanted and ledger.commit_point is not None
            }
            for key in wanted:
                self._ledgers.pop(key, None)
            for channel, buffer in self._buffers.items():
                kept = deque(record for record in buffer if record.key not in wanted)
                for record in buffer:
                    if record.key in wanted:
                        self._count -= 1
                        self._bytes -= len(record.delivery.payload)
                self._buffers[channel] = kept
            return points

    def partitions(self) -> list[Partition]:
        with self._lock:
            return list(self._ledgers)

    def progress(self, channel: str) -> LocalProgress:
        with self._lock:
            points: dict[int, int] = {}
            in_flight = pending = 0
            for (topic, partition), ledger in self._ledgers.items():
                if topic != channel:
                    continue
                if ledger.commit_point is not None:
                    points[partition] = ledger.commit_point
                for state in ledger.states.values():
                    in_flight += state is not State.BUFFERED
                    pending += state is State.HANDED_OUT
            return LocalProgress(points, in_flight, pending)

    def _take_from(self, buffer: deque[Record], max_count: int) -> list[Delivery]:
        taken: list[Delivery] = []
        now = self._clock()
        while buffer and len(taken) < max_count:
            record = buffer.popleft()
            ledger = self._ledgers[record.key]
            ledger.states[record.offset] = State.HANDED_OUT
            ledger.out[record.offset] = (now, record.delivery)
            self._count -= 1
            self._bytes -= len(record.delivery.payload)
            taken.append(record.delivery)
        return taken
