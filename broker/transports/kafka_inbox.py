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
would; the partition's commit point waits for it all the while.

The inbox also counts deliveries across members through marks in the commit
metadata (``kafka_marks``): a partition is ``open``ed with the mark its
member found committed; records may be held back until a mark the inbox
``wanted`` has been committed and reported ``marked``, and every commit
carries the metadata for its offset.

Two threads use it (the member's poll thread opens, adds and drops
partitions and writes marks, the event loop takes and acks records), so
every method holds one lock; none of them does I/O.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from broker.transport import Delivery
from broker.transports.kafka_marks import Mark, found_count

Partition = tuple[str, int]
Commit = tuple[int, str]  # (offset, metadata)


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
    sent: Commit | None = None  # the last commit handed to Kafka
    out: dict[int, tuple[float, Delivery]] = field(default_factory=dict)  # handed out, unacked: since when
    # Counting deliveries (kafka_marks):
    start: int = -1  # the offset the member started reading at
    start_count: int = 0  # the mark found there
    single_until: int = -1  # below this offset, one record out at a time, each after its own mark
    mark: Mark | None = None  # the last mark committed
    want: Mark | None = None  # a mark to commit before the next hand-out

    def pop_acked(self) -> None:
        while self.states:
            offset, state = next(iter(self.states.items()))
            if state is not State.ACKED:
                return
            del self.states[offset]
            self.commit_point = offset + 1

    def may_hand_out(self, offset: int) -> bool:
        """Whether the record at ``offset`` may go out now; in single file,
        asks for its mark first (``want``)."""
        if self.want is not None and self.mark is None:
            return False  # the first mark is not committed yet
        if offset >= self.single_until:
            # The last of the single file goes out alone too.
            return self.single_until < 0 or not any(out < self.single_until for out in self.out)
        if self.out or offset != next(iter(self.states)):
            return False
        if self.mark is not None and self.mark.offset == offset:
            return True
        self.want = Mark(offset, self.start_count + 1 if offset == self.start else 1)
        return False

    def attempts(self, delivery: Delivery, offset: int) -> int:
        counted = self.mark.count if self.mark is not None and self.mark.offset == offset else 0
        return max(delivery.attempts, counted)

    def metadata_for(self, point: int, leaving: bool = False) -> str:
        """The mark to commit with ``point``: its count if it is handed out;
        when leaving, the count found there if this member never handed it out."""
        if self.mark is not None and self.mark.offset == point:
            handed_out = point in self.out
            return (self.mark if handed_out or not leaving else self.mark.undone()).encode()
        return Mark(point, 1).encode() if point in self.out else ""

    def leave_commit(self) -> Commit | None:
        point = self.commit_point if self.commit_point is not None else (self.mark.offset if self.mark else None)
        return None if point is None else (point, self.metadata_for(point, leaving=True))


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
        self._acked = threading.Condition(self._lock)
        self._ledgers: dict[Partition, _Ledger] = {}
        self._buffers: dict[str, deque[Record]] = {}
        self._count = 0
        self._bytes = 0

    @property
    def buffered(self) -> tuple[int, int]:
        """(records, payload bytes) fetched and not yet handed out."""
        with self._lock:
            return self._count, self._bytes

    def is_open(self, key: Partition) -> bool:
        with self._lock:
            return key in self._ledgers

    def open(self, key: Partition, start: int, found: Mark | None, window: int) -> None:
        """Start on a partition at ``start`` with the mark ``found`` committed:
        it wants ``start`` marked handed out once more before any hand-out. A
        count there means the last readers died on ``start``, so the next
        ``window`` records go out one at a time, each after its own mark."""
        count = found_count(found, start)
        ledger = _Ledger(start=start, start_count=count, want=Mark(start, count + 1))
        if count:
            ledger.single_until = start + window
        with self._lock:
            self._ledgers[key] = ledger

    def wanted(self) -> dict[Partition, Mark]:
        """Marks to commit (each as the partition's offset and metadata) before records can go out."""
        with self._lock:
            return {key: ledger.want for key, ledger in self._ledgers.items() if ledger.want is not None}

    def marked(self, key: Partition, mark: Mark) -> None:
        """``mark`` is committed: the record it names may go out."""
        with self._lock:
            ledger = self._ledgers.get(key)
            if ledger is not None and ledger.want == mark:
                ledger.mark, ledger.want = mark, None
                ledger.sent = (mark.offset, mark.encode())

    def add(self, records: Iterable[Record]) -> int:
        added = 0
        with self._lock:
            for record in records:
                # A partition never opened (the member opens each first) counts nothing and holds nothing back.
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
        """Up to ``max_count`` buffered deliveries from the first of ``channels`` that has any to give."""
        with self._lock:
            for channel in channels:
                buffer = self._buffers.get(channel)
                if buffer and (taken := self._take_from(buffer, max_count)):
                    return taken
        return []

    def ack(self, channel: str, partition: int, offset: int) -> bool:
        """Mark a handed-out record acked; True when it was out in single file,
        so the record held back behind it may go out now. One not handed out
        (unknown, dropped on revoke, or fetched again since) is left alone: it
        will be delivered (again), which at-least-once allows."""
        with self._lock:
            ledger = self._ledgers.get((channel, partition))
            if ledger is None or ledger.states.get(offset) is not State.HANDED_OUT:
                return False
            ledger.states[offset] = State.ACKED
            del ledger.out[offset]
            ledger.pop_acked()
            self._acked.notify_all()
            return offset < ledger.single_until

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

    def due_commits(self) -> dict[Partition, Commit]:
        """Commits (point and metadata) that changed since they were last sent; marks them sent."""
        with self._lock:
            due: dict[Partition, Commit] = {}
            for key, ledger in self._ledgers.items():
                if ledger.commit_point is None:
                    continue
                commit = (ledger.commit_point, ledger.metadata_for(ledger.commit_point))
                if commit != ledger.sent:
                    due[key] = ledger.sent = commit
            return due

    def commit_failed(self, commits: dict[Partition, Commit]) -> None:
        """Send these again next time (unless a later one has been sent since)."""
        with self._lock:
            for key, commit in commits.items():
                ledger = self._ledgers.get(key)
                if ledger is not None and ledger.sent == commit:
                    ledger.sent = None

    def drop(self, partitions: Iterable[Partition]) -> dict[Partition, Commit]:
        """Forget partitions this member no longer owns, and return what to
        commit for each as it leaves. Buffered records of theirs are
        discarded; the partition's next owner reads them from the committed
        offset."""
        wanted = set(partitions)
        with self._lock:
            points = {key: commit for key, ledger in self._ledgers.items()
                      if key in wanted and (commit := ledger.leave_commit()) is not None}  # fmt: skip
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

    def unacked(self, partitions: Iterable[Partition]) -> int:
        """How many records of ``partitions`` are handed out and not acked."""
        with self._lock:
            return self._unacked(set(partitions))

    def wait_acked(self, partitions: Iterable[Partition], timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every record of ``partitions`` handed
        out here to be acked; how many are still out. A partition given up
        with records in hand is read again by its next owner, while this
        member's handlers go on to answer them too: a member leaving a
        partition waits for its answers first, so each is given once."""
        wanted = set(partitions)
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while (out := self._unacked(wanted)) and (remaining := deadline - time.monotonic()) > 0:
                self._acked.wait(remaining)
            return out

    def _unacked(self, partitions: set[Partition]) -> int:
        return sum(len(ledger.out) for key in partitions if (ledger := self._ledgers.get(key)) is not None)

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
        held: list[Record] = []
        blocked: set[Partition] = set()  # a partition's records go out in order: none after one held back
        now = self._clock()
        while buffer and len(taken) < max_count:
            record = buffer.popleft()
            ledger = self._ledgers[record.key]
            if record.key in blocked or not ledger.may_hand_out(record.offset):
                blocked.add(record.key)
                held.append(record)
                continue
            delivery = record.delivery
            attempts = ledger.attempts(delivery, record.offset)
            if attempts != delivery.attempts:
                delivery = replace(delivery, attempts=attempts)
            ledger.states[record.offset] = State.HANDED_OUT
            ledger.out[record.offset] = (now, delivery)
            self._count -= 1
            self._bytes -= len(delivery.payload)
            taken.append(delivery)
        buffer.extendleft(reversed(held))
        return taken
