"""The Kafka transport (kafka-python).

Each channel is a topic, created with ``partitions`` partitions on first
publish or subscribe. A group is a Kafka consumer group, and each
(group, consumer) pair one ``GroupMember``: a KafkaConsumer on a thread of
its own (see ``kafka_member``). Records carry the headers given to
``publish``; the record key, when there is one, comes back as the header
``kafka-key``. Message ids are ``<partition>-<offset>``.

Where Kafka differs from Redis Streams, and what this transport does:

- Work is shared by partition, not by message: a group member reads the
  partitions the group assigned it, so a message goes to whichever member
  owns its partition, in partition order. There is no order across
  partitions; a single-partition topic has one total order.
- A message is done when its partition's committed offset passes it, and
  the member commits only the acked prefix of each partition. A dead
  member's partitions go to the others when its session times out, and they
  read on from the committed offset, so its unacked messages come round
  again. ``claim_stale`` therefore only hands out again what this process's
  own members handed out and have held unacked for ``min_idle_s`` (a
  handler that failed to publish its reply while the broker was away, say):
  nothing else would ever bring those back while the member lives.
- ``release`` cannot rewind one message of a partition, so it publishes the
  message again (same key and headers, ``ferry-attempts`` one higher) and
  acks the original: any member may retry it, and the count travels with it.
- ``trim`` drops nothing: the topic's retention policy does. ``cap`` deletes
  records (DeleteRecords), each partition keeping its share of the newest.
- ``fetch_first`` serves the first channel that has something *buffered*;
  records already fetched from a later channel can go out before an earlier
  channel's records that have not yet been fetched.
- A message published without a key goes to the topic's partitions in turn
  (round robin), so work without affinity spreads evenly over the group's
  members; a key picks the partition by its hash, as Kafka's producers do.
- ``fetch`` with no timeout first waits (up to ``catch_up_timeout_s``) for the
  member to join its group and read up to the end offsets, so "what is
  there now" includes what was published just before.
- ``backlog`` counts from the group's committed offsets, corrected by this
  process's own members: deliveries handed out here count as delivered
  (pending until acked). Deliveries held by members in other processes count
  as not yet delivered.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from broker.errors import MessageTooLarge
from broker.transport import Delivery, Headers
from broker.transports.base import SETTLE_S, BaseTransport
from broker.transports.kafka_admin import cap_topic, create_topic, group_lag_bases, topic_limit
from broker.transports.kafka_api import (
    FAST_CRC, KafkaAdminClient, KafkaConnectionError, KafkaError, KafkaProducer, MessageSizeTooLargeError,
    UnknownBrokerIdError, reachable,
)  # fmt: skip
from broker.transports.kafka_marks import ATTEMPTS_HEADER, KEY_HEADER
from broker.transports.kafka_member import GroupMember
from broker.transports.kafka_settings import KafkaSettings

log = structlog.get_logger("ferry.broker.kafka")

# The transport's own headers, which ``release`` sets afresh.
OWN_HEADERS = frozenset({ATTEMPTS_HEADER, KEY_HEADER})
# A record batch header (61 bytes) and one record's own framing, with room to spare: a payload
# within this much of a topic's max.message.bytes is refused before it is sent.
RECORD_BATCH_OVERHEAD = 256


class KafkaTransport(BaseTransport):
    service = "kafka"
    foreign_errors = (KafkaError,)

    def __init__(self, settings: KafkaSettings | str) -> None:
        super().__init__()
        self._settings = KafkaSettings.from_url(settings) if isinstance(settings, str) else settings
        if not FAST_CRC:
            log.warning("kafka.slow_crc", hint="install kafka-python[crc32c]: records are checksummed in pure Python")
        # Blocking kafka-python calls (admin requests, the first send to a
        # topic) run here, never on the event loop.
        self._io = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ferry-kafka-io")
        self._admin_lock = threading.Lock()
        self._admin: KafkaAdminClient | None = None
        self._producer: KafkaProducer | None = None
        self._members: dict[tuple[str, str], GroupMember] = {}
        self._topics: set[str] = set()
        self._warm: dict[str, tuple[int, ...]] = {}  # topic -> its partitions, once the producer knows them
        self._limits: dict[str, int | None] = {}  # topic -> its max.message.bytes, read when warmed up
        self._turns: dict[str, int] = {}

    async def publish(self, channel: str, payload: bytes, *, key: str | None = None,
                      headers: Headers = ()) -> str:
        return await self._send(channel, payload, None if key is None else key.encode(), headers)

    async def fetch_first(
        self, channels: Sequence[str], group: str, consumer: str, max_count: int, timeout_s: float
    ) -> list[Delivery]:
        with self._guarded():
            for channel in channels:
                await self._ensure_topic(self._topic(channel))
            self._check_open()  # closed meanwhile: a member made now would be one the close never saw
            member = self._member(group, consumer, channels)
            return await member.fetch(channels, max_count, timeout_s)

    async def ack(self, delivery: Delivery) -> None:
        self._check_open()
        member = self._members.get((delivery.group, delivery.consumer))
        if member is not None:
            partition, offset = _position(delivery.message_id)
            member.ack(delivery.channel, partition, offset)

    def member_restarts(self, group: str, consumer: str) -> int:
        """How often ``consumer``'s KafkaConsumer in ``group`` was replaced by its watch
        (``kafka_watch``): a wedged join or a stalled fetch, each redelivering what was
        not yet committed."""
        member = self._members.get((group, consumer))
        return 0 if member is None else member.restarts

    async def trim(self, channel: str) -> int:
        """Kafka's retention policy drops old records; nothing to do here."""
        self._check_open()
        return 0

    async def cap(self, channel: str, max_count: int) -> int:
        """Deletes records (DeleteRecords) so that each partition keeps its
        share of ``max_count``, its newest; with records spread round robin,
        those are the channel's newest."""
        with self._guarded():
            return int(await self._blocking(self._cap, self._topic(channel), max(0, max_count)))

    async def claim_stale(
        self, channel: str, group: str, consumer: str, min_idle_s: float, max_count: int
    ) -> list[Delivery]:
        """Deliveries this process's members of ``group`` have held unacked
        for ``min_idle_s``, one attempt higher. Each stays with the member
        that holds its partition (``Delivery.consumer``), which its ack
        reaches. Another process's are the rebalance's to recover."""
        self._check_open()
        claimed: list[Delivery] = []
        for member in self._members.values():
            if member.group == group and len(claimed) < max_count:
                claimed += member.inbox.stale(channel, min_idle_s, max_count - len(claimed))
        return claimed

    async def release(self, delivery: Delivery) -> None:
        """Publish the delivery again with its attempt count raised, then ack it."""
        self._check_open()
        headers = tuple((name, value) for name, value in delivery.headers if name.lower() not in OWN_HEADERS)
        headers += ((ATTEMPTS_HEADER, str(delivery.attempts + 1).encode()),)
        await self._send(delivery.channel, delivery.payload, delivery.header(KEY_HEADER), headers)
        await self.ack(delivery)

    async def backlog(self, channel: str, group: str) -> tuple[int, int]:
        """(not yet delivered, delivered but not acked), as the module docstring qualifies."""
        with self._guarded():
            bases = await self._blocking(self._group_lag_bases, self._topic(channel), self._topic(group))
        if bases is None:
            return 0, 0
        in_flight = pending = 0
        for member in self._members.values():
            if member.group != group:
                continue
            progress = member.inbox.progress(channel)
            for partition, point in progress.commit_points.items():
                if partition in bases:
                    base, end = bases[partition]
                    bases[partition] = (max(base, point), end)
            in_flight += progress.in_flight
            pending += progress.pending
        unread = sum(max(0, end - base) for base, end in bases.values())
        return max(0, unread - in_flight), pending

    async def _shut_down(self) -> None:
        members, self._members = list(self._members.values()), {}
        await asyncio.gather(*(member.aclose() for member in members), return_exceptions=True)
        await self._settle(SETTLE_S)  # calls still on the I/O thread finish before their clients close
        await asyncio.get_running_loop().run_in_executor(self._io, self._close_clients)
        self._io.shutdown(wait=False)

    # -- helpers -------------------------------------------------------------

    async def _blocking(self, call: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._io, call, *args)

    def _member(self, group: str, consumer: str, channels: Sequence[str]) -> GroupMember:
        member = self._members.get((group, consumer))
        if member is None:
            member = self._members[(group, consumer)] = GroupMember(self._settings, group, consumer, channels)
        elif not member.topics.issuperset(channels):
            member.subscribe(channels)
        return member

    def _topic(self, name: str) -> str:
        """The cluster's name for a channel or group."""
        return self._settings.namespace + name

    async def _send(self, channel: str, payload: bytes, key: bytes | None, headers: Headers) -> str:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        topic = self._topic(channel)
        with self._guarded():
            await self._ensure_topic(topic)
            if topic not in self._warm:
                # The first send to a topic waits for its metadata; later ones only append to a buffer.
                await self._blocking(self._warm_up, topic)
            self._check_size(topic, payload, key, headers)
            sent = self._producer_client().send(topic, value=bytes(payload), key=key, headers=list(headers),
                                                partition=None if key is not None else self._next_partition(topic))
            sent.add_callback(lambda metadata: _settle(loop, done, metadata, None))
            sent.add_errback(lambda error: _settle(loop, done, None, error))
            try:
                metadata = await done
            except UnknownBrokerIdError:
                # kafka-python (3.0) can keep a dead broker as a partition's leader after the
                # broker has left the cluster's metadata, failing every send to it for good (seen
                # with a broker SIGKILLed on a starved host); a new producer reads the metadata afresh.
                await self._blocking(self._drop_producer)
                raise
            except MessageSizeTooLargeError:
                # Refused by a broker limit below the topic's (message.max.bytes). kafka-python's producer
                # fails every later send after this, so the next send gets a new one.
                await self._blocking(self._drop_producer)
                raise MessageTooLarge(_too_large(len(payload), topic, "the broker's message.max.bytes")) from None
        return f"{metadata.partition}-{metadata.offset}"

    def _check_size(self, topic: str, payload: bytes, key: bytes | None, headers: Headers) -> None:
        """Refuse here what the topic would refuse: a record over its ``max.message.bytes``."""
        limit = self._limits.get(topic)
        size = len(payload) + len(key or b"") + sum(len(name) + len(value) for name, value in headers)
        if limit is not None and size + RECORD_BATCH_OVERHEAD > limit:
            raise MessageTooLarge(_too_large(len(payload), topic, f"its max.message.bytes ({limit})"))

    def _warm_up(self, topic: str) -> None:
        with self._admin_lock:  # one producer, however many sends race to make it
            producer = self._producer_client()
        self._limits[topic] = self._topic_limit(topic)
        self._warm[topic] = tuple(sorted(producer.partitions_for(topic) or ()))

    def _topic_limit(self, topic: str) -> int | None:
        with self._admin_lock:
            return topic_limit(self._admin_client(), topic)

    def _drop_producer(self) -> None:
        with self._admin_lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.close(timeout=1)

    def _next_partition(self, topic: str) -> int | None:
        partitions = self._warm.get(topic)
        if not partitions:
            return None
        turn = self._turns.get(topic, 0)
        self._turns[topic] = turn + 1
        return partitions[turn % len(partitions)]

    def _producer_client(self) -> KafkaProducer:
        if self._producer is None:
            settings = self._settings
            self._check_reachable()
            self._producer = KafkaProducer(
                bootstrap_servers=list(settings.bootstrap), acks="all", enable_idempotence=True, linger_ms=2,
                compression_type=None,
                max_request_size=settings.max_message_bytes + (1 << 20),
                max_block_ms=settings.request_timeout_ms,
                request_timeout_ms=settings.request_timeout_ms, bootstrap_timeout_ms=settings.request_timeout_ms,
            )  # fmt: skip
        return self._producer

    def _check_reachable(self) -> None:
        if not reachable(self._settings.bootstrap, self._settings.request_timeout_ms / 1000):
            raise KafkaConnectionError(f"no broker at {','.join(self._settings.bootstrap)}")

    def _admin_client(self) -> KafkaAdminClient:
        if self._admin is None:
            self._check_reachable()
            self._admin = KafkaAdminClient(
                bootstrap_servers=list(self._settings.bootstrap), request_timeout_ms=self._settings.request_timeout_ms,
                bootstrap_timeout_ms=self._settings.request_timeout_ms,
            )  # fmt: skip
        return self._admin

    async def _ensure_topic(self, topic: str) -> None:
        if topic not in self._topics:
            await self._blocking(self._create_topic, topic)
            self._topics.add(topic)

    def _create_topic(self, topic: str) -> None:
        with self._admin_lock:
            create_topic(self._admin_client(), topic, self._settings)

    def _cap(self, topic: str, max_count: int) -> int:
        with self._admin_lock:
            return cap_topic(self._admin_client(), topic, max_count)

    def _group_lag_bases(self, topic: str, group: str) -> dict[int, tuple[int, int]] | None:
        with self._admin_lock:
            return group_lag_bases(self._admin_client(), topic, group)

    def _close_clients(self) -> None:
        if self._producer is not None:
            try:
                self._producer.flush(timeout=5)
            except KafkaError:
                pass
            self._producer.close(timeout=5)
        with self._admin_lock:
            if self._admin is not None:
                self._admin.close()


def _position(message_id: str) -> tuple[int, int]:
    partition, _, offset = message_id.partition("-")
    return int(partition), int(offset)


def _too_large(size: int, topic: str, limit: str) -> str:
    return (f"a message of {size} bytes is over {limit} on topic '{topic}'; larger tensors travel beside "
            "the message with a claim store (--claim-check-store, --claim-check-bytes)")


def _settle(loop: asyncio.AbstractEventLoop, done: asyncio.Future[Any], value: Any, error: Any) -> None:
    def settle() -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error if isinstance(error, BaseException) else KafkaError(str(error)))
        else:
            done.set_result(value)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:
        pass  # the loop has closed; nobody awaits the send any more
