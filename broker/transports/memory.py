"""The in-memory transport: ferry's embedded broker and the unit-test fake.

It keeps Redis Streams' semantics inside one event loop: each channel is an
ordered log, each group has a cursor and a pending list, and a message leaves
the pending list only when acked. ``claim_stale`` hands entries whose consumer
went quiet to another consumer, as XAUTOCLAIM does. ``cap`` drops the oldest
entries whether read or not, as XTRIM MAXLEN does: a channel no group reads
(the dead letters) is never trimmed, and is bounded that way instead.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from broker.transport import Delivery, Headers
from broker.transports.base import BaseTransport, wait_at_most


@dataclass(slots=True)
class _Pending:
    payload: bytes
    headers: Headers
    consumer: str
    delivered_at: float
    attempts: int


@dataclass(slots=True)
class _Group:
    cursor: int
    pending: dict[int, _Pending] = field(default_factory=dict)


@dataclass(slots=True)
class _Channel:
    log: deque[tuple[bytes, Headers]] = field(default_factory=deque)
    first_seq: int = 0
    groups: dict[str, _Group] = field(default_factory=dict)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    @property
    def end_seq(self) -> int:
        return self.first_seq + len(self.log)


class MemoryTransport(BaseTransport):
    service = "memory"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._channels: dict[str, _Channel] = {}
        self._clock = clock

    async def publish(self, channel: str, payload: bytes, *, key: str | None = None,
                      headers: Headers = ()) -> str:
        self._check_open()
        state = self._channel(channel)
        seq = state.end_seq
        state.log.append((bytes(payload), tuple(headers)))
        self._wake(state)
        return str(seq)

    async def fetch_first(
        self, channels: Sequence[str], group: str, consumer: str, max_count: int, timeout_s: float
    ) -> list[Delivery]:
        """Messages from the first of ``channels`` that has any, waiting at most
        ``timeout_s`` for one to arrive on any of them."""
        self._check_open()
        states = [(name, self._channel(name)) for name in channels]
        members = [self._group(state, group) for _, state in states]
        if all(m.cursor >= state.end_seq for m, (_, state) in zip(members, states)) and timeout_s > 0:
            await self._wait([state for _, state in states], timeout_s)
            self._check_open()
        for (name, state), group_state in zip(states, members):
            taken = self._take(name, state, group, group_state, consumer, max_count)
            if taken:
                return taken
        return []

    async def ack(self, delivery: Delivery) -> None:
        self._check_open()
        state = self._channels.get(delivery.channel)
        if state is None or delivery.group not in state.groups:
            return
        state.groups[delivery.group].pending.pop(int(delivery.message_id), None)
        self._trim(state)

    async def trim(self, channel: str) -> int:
        """Acked messages are already dropped on ack; this only reports zero."""
        self._check_open()
        state = self._channels.get(channel)
        return 0 if state is None else self._trim(state)

    async def cap(self, channel: str, max_count: int) -> int:
        """Drop the oldest messages beyond the newest ``max_count``; a group
        that had not read them skips them, and one holding them has them no more."""
        self._check_open()
        state = self._channels.get(channel)
        if state is None:
            return 0
        dropped = max(0, len(state.log) - max(0, max_count))
        for _ in range(dropped):
            state.log.popleft()
        state.first_seq += dropped
        for members in state.groups.values():
            members.cursor = max(members.cursor, state.first_seq)
            for seq in [seq for seq in members.pending if seq < state.first_seq]:
                del members.pending[seq]
        return dropped

    async def claim_stale(
        self, channel: str, group: str, consumer: str, min_idle_s: float, max_count: int
    ) -> list[Delivery]:
        """Take over pending entries idle for at least ``min_idle_s``."""
        self._check_open()
        members = self._channel(channel).groups.get(group)
        if members is None:
            return []
        now = self._clock()
        claimed: list[Delivery] = []
        for seq, entry in members.pending.items():
            if len(claimed) >= max_count:
                break
            if now - entry.delivered_at >= min_idle_s:
                entry.consumer, entry.delivered_at = consumer, now
                entry.attempts += 1
                claimed.append(Delivery(channel, group, str(seq), entry.payload, entry.attempts, entry.headers, consumer))
        return claimed

    async def backlog(self, channel: str, group: str) -> tuple[int, int]:
        """(messages not yet delivered, delivered but not acked) for a group."""
        self._check_open()
        state = self._channels.get(channel)
        if state is None:
            return 0, 0
        members = state.groups.get(group)
        if members is None:
            return len(state.log), 0
        return state.end_seq - members.cursor, len(members.pending)

    async def release(self, delivery: Delivery) -> None:
        """Make an unacked delivery claimable at once, for a retry elsewhere."""
        self._check_open()
        state = self._channels.get(delivery.channel)
        members = None if state is None else state.groups.get(delivery.group)
        entry = None if members is None else members.pending.get(int(delivery.message_id))
        if entry is not None:
            entry.delivered_at = float("-inf")

    async def _shut_down(self) -> None:
        for state in self._channels.values():
            self._wake(state)

    def _channel(self, name: str) -> _Channel:
        state = self._channels.get(name)
        if state is None:
            state = self._channels[name] = _Channel()
        return state

    @staticmethod
    def _group(state: _Channel, group: str) -> _Group:
        members = state.groups.get(group)
        if members is None:
            members = state.groups[group] = _Group(cursor=state.first_seq)
        return members

    def _take(
        self, channel: str, state: _Channel, group: str, members: _Group, consumer: str, limit: int
    ) -> list[Delivery]:
        now = self._clock()
        deliveries: list[Delivery] = []
        while members.cursor < state.end_seq and len(deliveries) < limit:
            seq = members.cursor
            payload, headers = state.log[seq - state.first_seq]
            members.pending[seq] = _Pending(payload, headers, consumer, now, 1)
            members.cursor += 1
            deliveries.append(Delivery(channel, group, str(seq), payload, 1, headers, consumer))
        return deliveries

    async def _wait(self, states: list[_Channel], timeout_s: float) -> None:
        waiter = asyncio.get_running_loop().create_future()
        for state in states:
            state.waiters.append(waiter)
        try:
            await wait_at_most(waiter, timeout_s)
        finally:
            for state in states:
                if waiter in state.waiters:
                    state.waiters.remove(waiter)

    @staticmethod
    def _wake(state: _Channel) -> None:
        waiters, state.waiters = state.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    @staticmethod
    def _trim(state: _Channel) -> int:
        # Keep everything some group has yet to read or ack; with no group yet,
        # keep it all so a consumer that starts late still sees it.
        if not state.groups:
            return 0
        keep_from = min(
            min(members.pending, default=members.cursor) for members in state.groups.values()
        )
        dropped = 0
        while state.first_seq < keep_from and state.log:
            state.log.popleft()
            state.first_seq += 1
            dropped += 1
        return dropped
