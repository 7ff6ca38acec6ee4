"""One member of a Kafka consumer group: a KafkaConsumer and the one thread that owns it.

kafka-python consumers are neither thread-safe nor asyncio, so each member's
consumer lives on a dedicated thread that polls it in a loop and hands
records to the event loop through an ``Inbox``. The thread polls whether or
not the application is fetching; when the inbox is full it pauses every
assigned partition and keeps polling, so a worker busy with a long batch
never overruns ``max.poll.interval.ms`` and triggers a rebalance (the storm
where every slow batch evicts its worker and hands its partitions around).
While paused it waits between polls for the event loop to take from the
inbox, and resumes as soon as there is room: a poll of paused partitions
would only sit out its timeout, and the member would fetch no more than a
full inbox per poll interval.

Acks are recorded in the inbox at once; the thread commits each partition's
acked prefix asynchronously on its next turn (at most ``poll_interval_ms``
later), and once more synchronously on close. A member giving partitions
up (a rebalance, a close) first waits a while for the records it handed out
to be acked, so that what it answered is committed before another member
reads on; then their acked prefixes are committed and their buffered records
dropped. Acks that arrive later are ignored, and the new owner reads those
messages again (at-least-once). The cooperative-sticky assignor
keeps every partition that does not move, so a member joining or leaving
does not make the others drop their work in hand.

Each partition the member starts reading is opened in the inbox with the
mark committed there, and the marks the inbox wants are committed (blocking,
on this thread) before the records they name go out: that is how deliveries
are counted across members (``kafka_marks``).

Broker outages do not end the thread: kafka-python reconnects by itself, and
a failed turn is logged and retried after a pause. A consumer that wedges
(``kafka_watch``: stuck mid-join, or fetching without moving) is closed and
the member starts over with a fresh one, from the committed offsets.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from broker.errors import TransportClosed
from broker.transport import Delivery
from broker.transports.kafka_api import (
    CooperativeStickyAssignor, KafkaConsumer, KafkaError, MemberState,
    KafkaConnectionError, OffsetAndMetadata, TopicPartition, reachable,
)  # fmt: skip
from broker.transports.base import wait_at_most
from broker.transports.kafka_inbox import Inbox, Partition, Record
from broker.transports.kafka_rebalance import Rebalance, commit_offsets
from broker.transports.kafka_marks import KEY_HEADER, decode_mark, header_attempts
from broker.transports.kafka_settings import KafkaSettings
from broker.transports.kafka_watch import Watch

log = structlog.get_logger("ferry.broker.kafka")

RETRY_PAUSE_S = 0.5
PAUSED_POLL_MS = 20
CLOSE_TIMEOUT_MS = 5_000


@dataclass(slots=True)
class _CatchUp:
    """A fetch waiting until the member holds what was published before it."""

    done: asyncio.Future[None]
    max_count: int
    ends: dict[TopicPartition, int] | None = None


class GroupMember:
    def __init__(self, settings: KafkaSettings, group: str, consumer: str, topics: Sequence[str]) -> None:
        self.group = group
        self.consumer = consumer
        self.inbox = Inbox()
        self._settings = settings
        self._namespace = settings.namespace
        self._topics = frozenset(topics)
        self._subscribed: frozenset[str] = frozenset()
        self._watch = Watch(settings.join_timeout_ms / 1000, settings.request_timeout_ms)
        # How long giving up partitions waits for the answers in hand (see Rebalance).
        self._settle_s = settings.session_timeout_ms / 2000
        self.restarts = 0  # consumers the watch replaced; each may hand out again what was not committed
        self._commit_retry_at = 0.0
        self._commits_failing = False
        self._loop = asyncio.get_running_loop()
        self._waiters: set[asyncio.Future[None]] = set()
        # Fetches with no timeout, waiting for the thread to say the member has caught up.
        self._catching_up: set[asyncio.Future[None]] = set()
        self._requests: queue.SimpleQueue[_CatchUp] = queue.SimpleQueue()
        self._catch_ups: list[_CatchUp] = []
        self._limit = settings.buffer_records
        self._stopping = threading.Event()
        self._room = threading.Event()  # set by the event loop when it takes from a full inbox
        self._paused = False  # the thread waits on _room
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"ferry-kafka-{group}-{consumer}", daemon=True)
        self._thread.start()

    # -- the event loop's side --------------------------------------------

    @property
    def topics(self) -> frozenset[str]:
        return self._topics

    def subscribe(self, topics: Sequence[str]) -> None:
        """Widen the subscription (a rebalance); the thread picks it up on its next turn."""
        self._topics = self._topics | frozenset(topics)

    async def fetch(self, channels: Sequence[str], max_count: int, timeout_s: float) -> list[Delivery]:
        self._limit = max(self._limit, 2 * max_count)
        if timeout_s <= 0:
            # "Nothing to wait for" on Kafka still means joining the group,
            # reading up to the end offsets and committing the marks that hold
            # records back: a message published before this call must come back
            # from it, as it does on the other transports.
            await self._catch_up(max_count)
            deadline = self._loop.time() + self._settings.catch_up_timeout_s
            taken = self._take(channels, max_count)
            while not taken and self.inbox.wanted() and (remaining := deadline - self._loop.time()) > 0:
                await self._wait(remaining)
                taken = self._take(channels, max_count)
            return taken
        deadline = self._loop.time() + timeout_s
        while not (taken := self._take(channels, max_count)):
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return []
            await self._wait(remaining)
        return taken

    def ack(self, channel: str, partition: int, offset: int) -> None:
        if self.inbox.ack(channel, partition, offset):
            # In single file the next record waits for this ack, and a fetch
            # for it is likely waiting already: it must ask for that record's
            # mark now, not once its timeout is over.
            self._wake()

    async def aclose(self) -> None:
        self._closed = True
        self._wake()
        self._stopping.set()
        self._room.set()
        await asyncio.to_thread(self._thread.join)

    def _take(self, channels: Sequence[str], max_count: int) -> list[Delivery]:
        if self._closed:
            raise TransportClosed("kafka transport is closed")
        taken = self.inbox.take(channels, max_count)
        if taken and self._paused and not self._full():
            self._room.set()
        return taken

    async def _wait(self, timeout_s: float) -> None:
        waiter = self._loop.create_future()
        self._waiters.add(waiter)
        try:
            await wait_at_most(waiter, timeout_s)
        finally:
            self._waiters.discard(waiter)

    async def _catch_up(self, max_count: int) -> None:
        request = _CatchUp(self._loop.create_future(), max_count)
        self._catching_up.add(request.done)
        self._requests.put(request)
        try:
            async with asyncio.timeout(self._settings.catch_up_timeout_s):
                await request.done
        except TimeoutError:
            log.warning("kafka.catch_up_timed_out", group=self.group, consumer=self.consumer)
        finally:
            self._catching_up.discard(request.done)

    def _wake(self) -> None:
        """Wake fetches waiting for records (and, once closed, those catching up)."""
        waiting = self._waiters | self._catching_up if self._closed else self._waiters
        for waiter in list(waiting):
            if not waiter.done():
                waiter.set_result(None)

    def _call_soon(self, callback: Any, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass  # the loop is gone; nobody is waiting any more

    # -- the poll thread's side --------------------------------------------

    def _run(self) -> None:
        consumer: KafkaConsumer | None = None
        failing = False
        while not self._stopping.is_set():
            try:
                if consumer is None:
                    consumer = self._open()
                self._turn(consumer)
                if reason := self._watch.verdict(consumer):
                    log.warning("kafka.member_restarted", group=self.group, consumer=self.consumer, reason=reason)
                    self.restarts += 1
                    self._close(consumer, self._settle_s)
                    consumer = None
                if failing:
                    failing = False
                    log.info("kafka.member_recovered", group=self.group, consumer=self.consumer)
            except Exception as exc:  # the thread must outlive any broker trouble
                # Once per outage at WARNING; the retries every RETRY_PAUSE_S only at DEBUG.
                report = log.debug if failing else log.warning
                report("kafka.member_failed", group=self.group, consumer=self.consumer, error=repr(exc))
                failing = True
                self._stopping.wait(RETRY_PAUSE_S)
        if consumer is not None:
            self._shut(consumer)

    def _open(self) -> KafkaConsumer:
        settings = self._settings
        if not reachable(settings.bootstrap, settings.request_timeout_ms / 1000):
            raise KafkaConnectionError(f"no broker at {','.join(settings.bootstrap)}")
        self._watch.reset()
        consumer = KafkaConsumer(
            bootstrap_servers=list(settings.bootstrap), group_id=self._namespace + self.group, client_id=self.consumer,
            enable_auto_commit=False, auto_offset_reset="earliest",
            partition_assignment_strategy=(CooperativeStickyAssignor,),
            session_timeout_ms=settings.session_timeout_ms, heartbeat_interval_ms=settings.heartbeat_interval_ms,
            max_poll_interval_ms=settings.max_poll_interval_ms, max_poll_records=settings.max_poll_records,
            fetch_max_bytes=settings.max_message_bytes + (1 << 20),
            max_partition_fetch_bytes=settings.max_partition_fetch_bytes,
            receive_message_max_bytes=settings.max_message_bytes + (4 << 20),
            bootstrap_timeout_ms=settings.request_timeout_ms,
        )  # fmt: skip
        self._subscribe(consumer)
        return consumer

    def _subscribe(self, consumer: KafkaConsumer) -> None:
        self._subscribed = self._topics
        topics = sorted(self._namespace + topic for topic in self._subscribed)
        # The group leader assigns only partitions its metadata knows of; a
        # topic created a moment ago may not be there yet, and the first
        # generation would then hand out nothing.
        for topic in topics:
            consumer.partitions_for_topic(topic)
        listener = Rebalance(consumer, self.inbox, self._namespace, log.bind(group=self.group, consumer=self.consumer),
                             self._settle_s)
        consumer.subscribe(topics, listener=listener)

    def _turn(self, consumer: KafkaConsumer) -> None:
        if self._topics != self._subscribed:
            self._subscribe(consumer)
        self._commit(consumer)
        self._write_marks(consumer)
        paused = self._flow(consumer)
        if paused:
            self._wait_for_room()
            paused = self._flow(consumer)  # resumed at once if the event loop took from it
        # Still paused: a short poll, which fetches nothing but keeps the member in its group (with
        # polls of 0 ms, a member fell out of its group past max.poll.interval.ms in the test suite).
        batches = consumer.poll(timeout_ms=PAUSED_POLL_MS if paused else self._settings.poll_interval_ms)
        records = [self._record(r) for batch in batches.values() for r in batch]
        if records:
            self._open_new(consumer, records)
            if self.inbox.add(records):
                self._call_soon(self._wake)
            self._write_marks(consumer)
        self._serve_catch_ups(consumer)

    def _open_new(self, consumer: KafkaConsumer, records: list[Record]) -> None:
        """Open the partitions these records start, each with the mark committed there."""
        starts: dict[Partition, int] = {}
        for record in records:
            if record.key not in starts and not self.inbox.is_open(record.key):
                starts[record.key] = record.offset
        for (topic, partition), start in starts.items():
            tp = TopicPartition(self._namespace + topic, partition)
            committed = consumer.committed(tp, metadata=True, timeout_ms=self._settings.request_timeout_ms)
            found = decode_mark(committed.metadata) if committed is not None else None
            if found is not None and found.offset == start:
                log.info("kafka.partition_suspect", group=self.group, topic=topic, partition=partition,
                         offset=start, handed_out=found.count)
            self.inbox.open((topic, partition), start, found, self._limit)

    def _write_marks(self, consumer: KafkaConsumer) -> None:
        """Commit the marks the inbox waits for, then let their records go."""
        wanted = self.inbox.wanted()
        if not wanted:
            return
        offsets = {TopicPartition(self._namespace + topic, partition): OffsetAndMetadata(mark.offset, mark.encode(), -1)
                   for (topic, partition), mark in wanted.items()}  # fmt: skip
        try:
            consumer.commit(offsets, timeout_ms=self._settings.request_timeout_ms)
        except KafkaError as exc:  # a rebalance or the coordinator away: try again next turn
            log.info("kafka.mark_failed", group=self.group, consumer=self.consumer, error=repr(exc))
            return
        for key, mark in wanted.items():
            self.inbox.marked(key, mark)
        self._call_soon(self._wake)

    def _commit(self, consumer: KafkaConsumer) -> None:
        # While commits fail (the coordinator is away), retry at a walk, and say so once.
        if time.monotonic() < self._commit_retry_at:
            return
        due = self.inbox.due_commits()
        if not due:
            return

        def done(_offsets: object, response: object) -> None:
            if isinstance(response, Exception):
                if not self._commits_failing:
                    log.warning("kafka.commit_failed", group=self.group, consumer=self.consumer, error=repr(response))
                self._commits_failing = True
                self._commit_retry_at = time.monotonic() + RETRY_PAUSE_S
                self.inbox.commit_failed(due)
            elif self._commits_failing:
                self._commits_failing = False
                log.info("kafka.commits_resumed", group=self.group, consumer=self.consumer)

        consumer.commit_async(commit_offsets(due, self._namespace), callback=done)

    def _full(self) -> bool:
        count, size = self.inbox.buffered
        return count >= self._limit or size >= self._settings.buffer_bytes

    def _flow(self, consumer: KafkaConsumer) -> bool:
        """Pause every assigned partition while the inbox is full, resume them once it is not;
        whether they are paused now."""
        if self._full():
            assigned = consumer.assignment()
            if assigned - consumer.paused():
                consumer.pause(*assigned)
            return bool(assigned)
        if consumer.paused():
            consumer.resume(*consumer.paused())
        return False

    def _wait_for_room(self) -> None:
        """Until the event loop takes from the full inbox, or one poll interval (commits and the
        watch have their turn then)."""
        self._room.clear()
        self._paused = True  # (after the clear: a take from now on sets it again)
        try:
            if self._full():
                self._room.wait(self._settings.poll_interval_ms / 1000)
        finally:
            self._paused = False

    def _serve_catch_ups(self, consumer: KafkaConsumer) -> None:
        while not self._requests.empty():
            self._catch_ups.append(self._requests.get())
        waiting = []
        for request in self._catch_ups:
            if request.done.done():
                continue  # timed out on the loop's side
            if self._caught_up(consumer, request):
                self._call_soon(_resolve, request.done)
            else:
                waiting.append(request)
        self._catch_ups = waiting

    def _caught_up(self, consumer: KafkaConsumer, request: _CatchUp) -> bool:
        if consumer.group_metadata().state != MemberState.STABLE:
            return False
        assigned = consumer.assignment()
        if self.inbox.buffered[0] >= request.max_count or (assigned and assigned <= consumer.paused()):
            return True
        if request.ends is None or set(request.ends) != assigned:
            request.ends = consumer.end_offsets(list(assigned), timeout_ms=self._settings.request_timeout_ms)
        return all(consumer.position(tp, timeout_ms=self._settings.request_timeout_ms) >= end
                   for tp, end in request.ends.items())  # fmt: skip

    def _record(self, record: Any) -> Record:
        headers = tuple((name, bytes(value or b"")) for name, value in (record.headers or ()))
        if record.key is not None:
            headers += ((KEY_HEADER, bytes(record.key)),)
        attempts = header_attempts(headers)
        delivery = Delivery(
            record.topic.removeprefix(self._namespace), self.group, f"{record.partition}-{record.offset}", bytes(record.value or b""),
            attempts, headers, self.consumer,
        )  # fmt: skip
        return Record(record.partition, record.offset, delivery)

    def _shut(self, consumer: KafkaConsumer) -> None:
        self._close(consumer)
        for request in self._catch_ups:
            self._call_soon(_resolve, request.done)

    def _close(self, consumer: KafkaConsumer, settle_s: float = 0.0) -> None:
        # A consumer replaced while the member lives lets the answers in hand go
        # out first (see Rebalance); on the transport's close nobody is left to
        # answer. Whatever is not acked by then is the next consumer's to read
        # again. A commit the coordinator could not take (it moved: a broker
        # died) is tried again while time is left, since each acked record past
        # the last commit would be answered twice.
        partitions = self.inbox.partitions()
        unacked = self.inbox.wait_acked(partitions, settle_s)
        leaving = self.inbox.drop(partitions)
        deadline = time.monotonic() + CLOSE_TIMEOUT_MS / 1000
        while leaving:
            try:
                consumer.commit(commit_offsets(leaving, self._namespace), timeout_ms=CLOSE_TIMEOUT_MS)
                break
            except Exception as exc:
                if not getattr(exc, "retriable", False) or time.monotonic() + RETRY_PAUSE_S > deadline:
                    log.warning("kafka.final_commit_failed", group=self.group, unacked=unacked, error=repr(exc))
                    break
                time.sleep(RETRY_PAUSE_S)
        try:
            consumer.close(autocommit=False, timeout_ms=CLOSE_TIMEOUT_MS)
        except Exception as exc:
            log.warning("kafka.close_failed", group=self.group, error=repr(exc))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
