"""The Redis Streams transport, on one server or a Redis Cluster (``broker.redis_url``).

Each channel is a stream whose key is the channel's name (``channels.redis_key``:
a model's priority levels share one hash tag, so a cluster keeps them on one
slot and one XREADGROUP reads them all); each message is one
entry holding the payload in a single field. Groups are Redis consumer
groups, created at id ``0`` on a group's first fetch so that messages
published before the group existed are still delivered to it, as the memory
transport does. ``claim_stale`` is XAUTOCLAIM; a claimed delivery's
``attempts`` is the entry's delivery count from XPENDING.

``trim`` is one Lua script, so it is atomic: it finds, over every group of
the stream, the oldest entry still pending or not yet delivered, and XTRIMs
with MINID just below it. An entry some group has yet to read or ack is never
dropped. (A group created *after* a trim starts from what is left.)
``cap`` is ``XTRIM MAXLEN``: it drops the oldest entries, read or not.
``release`` re-claims a delivery with a large IDLE, so the next
``claim_stale`` by any consumer takes it at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio import ConnectionPool, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError, ResponseError

from broker.channels import redis_key
from broker.errors import TransportClosed
from broker.redis_url import REDIS_ERRORS, async_client
from broker.transport import Delivery, Headers
from broker.transports.base import SETTLE_S, BaseTransport
from broker.redis_pipe import pipes_for, run_script

PAYLOAD_FIELD = b"d"
# Each header is a field of its own, named "h.<header>".
HEADER_PREFIX = b"h."
MAX_CONNECTIONS = 512
POOL_TIMEOUT_S = 30.0
# Release: an idle time far beyond any claim threshold.
RELEASED_IDLE_MS = 10**12
_TRIM_ACKED = """
local function older(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, aseq, bms, bseq = tonumber(ams), tonumber(aseq), tonumber(bms), tonumber(bseq)
  return ams < bms or (ams == bms and aseq < bseq)
end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then return 0 end
local floor = nil
for _, flat in ipairs(groups) do
  local info = {}
  for i = 1, #flat, 2 do info[flat[i]] = flat[i + 1] end
  -- Everything after last-delivered-id is unread; keep that entry itself too.
  local keep = info['last-delivered-id']
  if tonumber(info['pending']) > 0 then
    keep = redis.call('XPENDING', KEYS[1], info['name'])[2]
  end
  if floor == nil or older(keep, floor) then floor = keep end
end
return redis.call('XTRIM', KEYS[1], 'MINID', floor)
"""
# A reply and the ack of the request it answers, in one round trip; the ack only once the
# reply is on its stream (an error in XADD stops the script before XACK).
# KEYS: the reply stream, the request stream; ARGV: the group, the request's id, then field, value, ...
_REPLY_AND_ACK = """
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
redis.call('XACK', KEYS[2], ARGV[1], ARGV[2])
return id
"""
# Renew: each id still pending with this consumer, idle at least ARGV[3] ms and not released,
# is made just delivered (its delivery count kept). KEYS: the stream; ARGV: group, consumer,
# min idle ms, the released idle ms, then the ids.
_RENEW = """
local renewed = 0
for i = 5, #ARGV do
  local entry = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)[1]
  if entry and entry[2] == ARGV[2] and entry[3] >= tonumber(ARGV[3]) and entry[3] < tonumber(ARGV[4]) then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    renewed = renewed + 1
  end
end
return renewed
"""
# How often a fetch over channels on several slots of a Redis Cluster looks at them again.
CROSS_SLOT_POLL_S = 0.05
# XAUTOCLAIM scans a bounded number of pending entries per call; a sweep stops
# after this many calls even if the cursor has not come round.
MAX_CLAIM_ROUNDS = 100


class RedisTransport(BaseTransport):
    service = "redis"
    foreign_errors = REDIS_ERRORS

    def __init__(self, url: str) -> None:
        super().__init__()
        # A pool of our own: each concurrent command takes its own connection,
        # so a fetch blocked in XREADGROUP never holds up a publish.
        # RESP2 pins the reply shapes parsed below.
        # On one server the pool is bounded but blocking: past MAX_CONNECTIONS a command
        # waits for a free connection instead of failing (a cluster keeps as many per node).
        # No socket timeout (redis-py 8 defaults to 5 s): a fetch blocks
        # server-side for as long as its caller asks.
        self._redis = async_client(url, max_connections=MAX_CONNECTIONS, pool_timeout_s=POOL_TIMEOUT_S,
                                   socket_timeout=None)
        self._cluster = isinstance(self._redis, RedisCluster)
        self._groups: set[tuple[str, str]] = set()
        self._readers: set[asyncio.Task[Any]] = set()  # tasks inside XREADGROUP now
        self._closing: set[asyncio.Task[Any]] = set()  # of those, the ones closing cancelled
        self._trim_acked = self._redis.register_script(_TRIM_ACKED)
        self._reply_and_ack = self._redis.register_script(_REPLY_AND_ACK)
        self._renew = self._redis.register_script(_RENEW)
        # The commands of every request (a publish; a reply and an ack) go out together with
        # those due at the same time (broker.redis_pipe): on one connection to one
        # server, on one per master of a cluster. On one server, reads skip redis-py's command
        # layer too (_xreadgroup).
        self._pipes = pipes_for(self._redis, on_master_lost=self._master_lost)
        self._pool = None if isinstance(self._redis, RedisCluster) else self._redis.connection_pool
        # Connections a read ended on cleanly, kept out of the pool for the next reads (see _xreadgroup).
        self._kept: list[AbstractConnection] = []

    async def publish(self, channel: str, payload: bytes, *, key: str | None = None,
                      headers: Headers = ()) -> str:
        with self._guarded():
            stream = redis_key(channel)
            message_id = await self._command(stream, "XADD", stream, "*", *_flat(_fields(payload, headers)))
        return _text(message_id)

    async def reply(self, channel: str, payload: bytes, delivery: Delivery, *, key: str | None = None,
                    headers: Headers = ()) -> None:
        reply_key, request_key = redis_key(channel), redis_key(delivery.channel)
        if self._cluster and key_slot(reply_key.encode()) != key_slot(request_key.encode()):
            await super().reply(channel, payload, delivery, key=key, headers=headers)  # a script runs on one slot
            return
        args: list[bytes | str] = [delivery.group, delivery.message_id, *_flat(_fields(payload, headers))]
        with self._guarded():
            await run_script(self._pipes, self._reply_and_ack, (reply_key, request_key), args)

    def _master_lost(self) -> None:
        """A cluster master failed under a command its pipe sent (the cluster client then
        sent it): a failure to count, though the command itself may succeed."""
        self.failures += 1

    async def _command(self, key: str, *command: Any) -> Any:
        """A command that never blocks, on ``key``, sent together with those due at the same time."""
        return await self._pipes.call_for(key, *command)

    async def fetch_first(
        self, channels: Sequence[str], group: str, consumer: str, max_count: int, timeout_s: float
    ) -> list[Delivery]:
        with self._guarded():
            for channel in channels:
                await self._ensure_group(channel, group)
            # With several channels, look at each in order without waiting, so
            # an earlier one is drained before a later one is read at all.
            deadline = asyncio.get_running_loop().time() + timeout_s
            while True:
                if len(channels) > 1:
                    for channel in channels:
                        reply = await self._read_group((channel,), group, consumer, max_count, 0)
                        if reply:
                            return self._deliveries(reply, channels, group, consumer)
                if not self._across_slots(channels):
                    reply = await self._read_group(channels, group, consumer, max_count, timeout_s)
                    return self._deliveries(reply, channels, group, consumer)
                # A Redis Cluster blocks one XREADGROUP on one slot only; channels on several
                # (ferry's own are not: see channels.redis_key) are looked at again shortly.
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    return []
                await asyncio.sleep(min(CROSS_SLOT_POLL_S, left))

    async def holds(self, channel: str, message_ids: Sequence[str]) -> list[bool]:
        """One XRANGE from each id to itself, all sent together."""
        stream = redis_key(channel)
        with self._guarded():
            found = await asyncio.gather(*(self._command(stream, "XRANGE", stream, mid, mid)
                                           for mid in message_ids))
        return [bool(entries) for entries in found]

    def _across_slots(self, channels: Sequence[str]) -> bool:
        return self._cluster and len({key_slot(redis_key(channel).encode()) for channel in channels}) > 1

    async def ack(self, delivery: Delivery) -> None:
        await self.ack_all((delivery,))

    async def ack_all(self, deliveries: Sequence[Delivery]) -> None:
        by_group: dict[tuple[str, str], list[str]] = {}
        for delivery in deliveries:
            by_group.setdefault((delivery.channel, delivery.group), []).append(delivery.message_id)
        with self._guarded():
            for (channel, group), ids in by_group.items():  # one XACK each: a stream takes many ids at once
                stream = redis_key(channel)
                await self._command(stream, "XACK", stream, group, *ids)

    async def trim(self, channel: str) -> int:
        with self._guarded():
            return int(await self._trim_acked(keys=[redis_key(channel)]))

    async def cap(self, channel: str, max_count: int) -> int:
        with self._guarded():
            # Exact, not MAXLEN ~: an approximate trim keeps up to a whole radix
            # node (100 entries) more, and a capped stream is small anyway.
            return int(await self._redis.xtrim(redis_key(channel), maxlen=max(0, max_count), approximate=False))

    async def release(self, delivery: Delivery) -> None:
        """Make an unacked delivery claimable at once, keeping its delivery count."""
        with self._guarded():
            await self._redis.xclaim(
                redis_key(delivery.channel), delivery.group, delivery.consumer or "released", 0, [delivery.message_id],
                idle=RELEASED_IDLE_MS, retrycount=delivery.attempts, justid=True,
            )

    async def renew(self, channel: str, group: str, consumer: str, message_ids: Sequence[str],
                    min_idle_s: float) -> int:
        """Those of ``message_ids`` this consumer holds, idle ``min_idle_s`` or more, made just delivered
        (their delivery counts kept), so no other member's ``claim_stale`` takes them; a delivery
        released for a retry, or taken over by another member meanwhile, is left as it is."""
        if not message_ids:
            return 0
        with self._guarded():
            return int(await self._renew(keys=[redis_key(channel)], args=[
                group, consumer, int(min_idle_s * 1000), RELEASED_IDLE_MS // 2, *message_ids]))

    async def claim_stale(
        self, channel: str, group: str, consumer: str, min_idle_s: float, max_count: int
    ) -> list[Delivery]:
        """Take over pending entries idle for at least ``min_idle_s``."""
        with self._guarded():
            try:
                entries = await self._autoclaim(channel, group, consumer, min_idle_s, max_count)
            except ResponseError as exc:
                if _is_nogroup(exc):
                    return []
                raise
            attempts = await self._delivery_counts(channel, group, [mid for mid, _ in entries])
        # An entry acked between the two calls is done; handing it out again
        # would only repeat finished work.
        return [
            Delivery(channel, group, _text(mid), _payload(fields), attempts[_text(mid)], _headers(fields), consumer)
            for mid, fields in entries
            if _text(mid) in attempts
        ]

    async def backlog(self, channel: str, group: str) -> tuple[int, int]:
        """(messages not yet delivered, delivered but not acked) for a group."""
        with self._guarded():
            try:
                groups = await self._redis.xinfo_groups(redis_key(channel))
            except ResponseError as exc:
                if "no such key" in str(exc).lower():
                    return 0, 0
                raise
            info = next((g for g in groups if _text(g["name"]) == group), None)
            if info is None:
                return int(await self._redis.xlen(redis_key(channel))), 0
            return await self._lag(channel, info), int(info["pending"])

    async def _shut_down(self) -> None:
        # Blocked reads would otherwise hold their connections until BLOCK
        # expires; cancelling them lets fetch report TransportClosed at once.
        for reader in list(self._readers):
            self._closing.add(reader)
            reader.cancel()
        # Those reads end now, the other calls within a round trip; a call cut off by the pool's
        # close would be retried by redis-py on a fresh connection that nothing closes.
        await self._settle(SETTLE_S)
        await self._pipes.aclose()
        if self._pool is not None:
            kept, self._kept = self._kept, []
            for connection in kept:
                await self._pool.release(connection)
        await self._redis.aclose()

    async def _ensure_group(self, channel: str, group: str) -> None:
        if (channel, group) in self._groups:
            return
        try:
            await self._redis.xgroup_create(redis_key(channel), group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._groups.add((channel, group))

    async def _read_group(
        self, channels: Sequence[str], group: str, consumer: str, max_count: int, timeout_s: float
    ) -> list[Any]:
        try:
            return await self._read(channels, group, consumer, max_count, timeout_s)
        except ResponseError as exc:
            if not _is_nogroup(exc):
                raise
            # A stream or group vanished under us (deleted, flushed).
            for channel in channels:
                self._groups.discard((channel, group))
                await self._ensure_group(channel, group)
            return await self._read(channels, group, consumer, max_count, timeout_s)

    async def _read(
        self, channels: Sequence[str], group: str, consumer: str, max_count: int, timeout_s: float
    ) -> list[Any]:
        # BLOCK 0 would wait forever, so a zero timeout omits BLOCK instead.
        block = max(1, round(timeout_s * 1000)) if timeout_s > 0 else None
        # Closed while this fetch awaited something else? Then _shut_down has already cancelled the
        # reads it knew of, and one started now would hold its connection until BLOCK ran out.
        self._check_open()
        # The read runs in the caller's own task (a task of its own that never got to run would
        # leave its command's coroutine unawaited); closing cancels that task, and takes the
        # cancellation back here, so the caller sees TransportClosed (see _closing_alone).
        reader = asyncio.current_task()
        assert reader is not None, "a fetch runs in a task"
        self._readers.add(reader)
        try:
            keys = [redis_key(channel) for channel in channels]
            if self._pool is None:
                reply = await self._redis.xreadgroup(group, consumer, dict.fromkeys(keys, ">"), count=max_count,
                                                     block=block)
            else:
                reply = await self._xreadgroup(self._pool, keys, group, consumer, max_count, block)
        except asyncio.CancelledError:
            if self._closing_alone(reader):
                raise TransportClosed("redis transport is closed") from None
            raise
        finally:
            self._readers.discard(reader)
        if reader.cancelling():
            # redis-py can absorb a cancellation and return normally; whoever cancelled must
            # still be obeyed, or a reader loop being shut down would go on reading forever.
            if self._closing_alone(reader):
                raise TransportClosed("redis transport is closed")
            raise asyncio.CancelledError
        return list(reply or [])

    async def _xreadgroup(self, pool: ConnectionPool, keys: list[str], group: str, consumer: str, max_count: int,
                          block: int | None) -> list[Any]:
        """XREADGROUP on one server, past redis-py's command layer (a third of a fetch's CPU): the
        reply as redis-py's ``xreadgroup`` gives it, each entry's fields a dict.

        A read takes a connection an earlier read ended on cleanly, and keeps it after: taking one
        from the pool and giving it back, with the pool's checks, cost an empty read 103 CPU µs
        against 65. A kept connection whose server went away since (a restart) fails at once:
        that is counted among the transport's failures, and the read is then made on one from the
        pool, which connects afresh, as a pooled read would have been. A read cancelled or failed
        leaves its connection closed, as redis-py's would, and back in the pool."""
        command: list[Any] = ["XREADGROUP", "GROUP", group, consumer, "COUNT", max_count]
        if block is not None:
            command += ["BLOCK", block]
        command += ["STREAMS", *keys, *(">" for _ in keys)]
        if self._kept:
            try:
                return _read_entries(await self._read_on(pool, self._kept.pop(), command))
            except (RedisConnectionError, OSError):
                # The server dropped it since (restarted, or killed its clients): a failure to count,
                # as a pooled read cut off would have been (the lost-request ledger looks then),
                # though this read is made again on a fresh connection, below.
                self.failures += 1
        fresh = await pool.get_connection()  # type: ignore[no-untyped-call]
        return _read_entries(await self._read_on(pool, fresh, command))

    async def _read_on(self, pool: ConnectionPool, connection: AbstractConnection, command: list[Any]) -> Any:
        try:
            await connection.send_command(*command)
            reply = await connection.read_response()
        except BaseException:
            await pool.release(connection)
            raise
        self._kept.append(connection)
        return reply

    def _closing_alone(self, reader: asyncio.Task[Any]) -> bool:
        """Whether ``reader`` was cancelled by closing and by no one else; closing's
        cancellation is then withdrawn."""
        if reader not in self._closing:
            return False
        self._closing.discard(reader)
        return reader.uncancel() == 0

    @staticmethod
    def _deliveries(reply: list[Any], channels: Sequence[str], group: str, consumer: str) -> list[Delivery]:
        by_key = {redis_key(channel): channel for channel in channels}
        return [
            Delivery(by_key[_text(stream)], group, _text(message_id), _payload(fields), 1, _headers(fields), consumer)
            for stream, entries in reply
            for message_id, fields in entries
        ]

    async def _autoclaim(
        self, channel: str, group: str, consumer: str, min_idle_s: float, max_count: int
    ) -> list[tuple[bytes, dict[bytes, bytes]]]:
        min_idle_ms = max(0, round(min_idle_s * 1000))
        claimed: list[tuple[bytes, dict[bytes, bytes]]] = []
        cursor: bytes | str = "0-0"
        for _ in range(MAX_CLAIM_ROUNDS):
            if len(claimed) >= max_count:
                break
            reply = await self._redis.xautoclaim(
                redis_key(channel), group, consumer, min_idle_ms, start_id=cursor, count=max_count - len(claimed)
            )
            cursor, entries = reply[0], reply[1]
            # Entries deleted from the stream come back without fields; skip them.
            claimed += [(mid, fields) for mid, fields in entries if fields]
            if _text(cursor) == "0-0":
                break
        return claimed

    async def _delivery_counts(self, channel: str, group: str, ids: list[bytes]) -> dict[str, int]:
        if not ids:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for mid in ids:
                pipe.xpending_range(redis_key(channel), group, min=mid, max=mid, count=1)
            replies = await pipe.execute()
        return {
            _text(row["message_id"]): int(row["times_delivered"]) for rows in replies for row in rows
        }

    async def _lag(self, channel: str, info: dict[str, Any]) -> int:
        lag = info.get("lag")
        if lag is not None:
            return int(lag)
        # Redis cannot always count the lag (after deletions); count it by hand.
        last = _text(info["last-delivered-id"])
        entries = await self._redis.xrange(redis_key(channel), min=f"({last}", max="+")
        return len(entries or [])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _payload(fields: dict[bytes, bytes]) -> bytes:
    return bytes(fields.get(PAYLOAD_FIELD, b""))


def _headers(fields: dict[bytes, bytes]) -> Headers:
    return tuple(
        (name[len(HEADER_PREFIX):].decode(errors="replace"), bytes(value))
        for name, value in fields.items() if name.startswith(HEADER_PREFIX)
    )


def _is_nogroup(exc: ResponseError) -> bool:
    return str(exc).startswith("NOGROUP")


def _read_entries(reply: Any) -> list[Any]:
    """An XREADGROUP reply as redis-py's ``xreadgroup`` gives it, each entry's fields a dict."""
    return [[stream, [(mid, _pairs(fields)) for mid, fields in entries]] for stream, entries in reply or ()]


def _pairs(flat: list[bytes] | None) -> dict[bytes, bytes]:
    """An entry's fields as a dict from RESP2's name, value, name, value..."""
    return dict(zip(flat[::2], flat[1::2])) if flat else {}


def _flat(fields: dict[bytes, bytes]) -> list[bytes]:
    """A stream entry's fields as XADD takes them: name, value, name, value..."""
    return [part for pair in fields.items() for part in pair]


def _fields(payload: bytes, headers: Headers) -> dict[bytes, bytes]:
    fields: dict[bytes, bytes] = {HEADER_PREFIX + name.encode(): bytes(value) for name, value in headers}
    fields[PAYLOAD_FIELD] = bytes(payload)
    return fields
