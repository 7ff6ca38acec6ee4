"""The in-memory transport: ferry's embedded broker and the unit-test fake.

It keeps Redis Streams' semantics inside one event loop: each channel is an
ordered log, each group has a cursor and a pending list, and a message leaves
the pending list only when acked. ``claim_stale`` hands entries whose consumer
went quiet to another consumer, as XAUTOCLAIM does.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.errors import TransportClosed
from broker.transport import Delivery


@dataclass(slots=True)
class _Pending:
    payload: bytes
    consumer: str
    delivered_at: float
    attempts: int


@dataclass(slots=True)
class _Group:
    cursor: int
    pending: dict[int, _Pending] = field(default_factory=dict)


@dataclass(slots=True)
class _Channel:
    log: deque[bytes] = field(default_factory=deque)
    first_seq: int = 0
    groups: dict[str, _Group] = field(default_factory=dict)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    @property
    def end_seq(self) -> int:
        return self.first_seq + len(self.log)


class MemoryTransport:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._channels: dict[str, _Channel] = {}
        self._clock = clock
        self._closed = False

    async def __aenter__(self) -> MemoryTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def publish(self, channel: str, payload: bytes) -> str:
        self._check_open()
        state = self._channel(channel)
        seq = state.end_seq
        state.log.append(bytes(payload))
        self._wake(state)
        return str(seq)

    async def fetch(
        self, channel: str, group: str, consumer: str, max_count: int, timeout_s: float
    ) -> list[Delivery]:
        self._check_open()
        state = self._channel(channel)
        members = state.groups.get(group)
        if members is None:
            members = state.groups[group] = _Group(cursor=state.first_seq)
        if members.cursor >= state.end_seq and timeout_s > 0:
            await self._wait(state, timeout_s)
            self._check_open()
        return self._take(channel, state, group, members, consumer, max_count)

    async def ack(self, delivery: Delivery) -> None:
        self._check_open()
        state = self._channels.get(delivery.channel)
        if state is None or delivery.group not in state.groups:
            return
        state.groups[delivery.group].pending.pop(int(delivery.message_id), None)
        self._trim(state)

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
                claimed.append(Delivery(channel, group, str(seq), entry.payload, entry.attempts))
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

    async def aclose(self) -> None:
        self._closed = True
        for state in self._channels.values():
            self._wake(state)

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosed("memory transport is closed")

    def _channel(self, name: str) -> _Channel:
        state = self._channels.get(name)
        if state is None:
            state = self._channels[name] = _Channel()
        return state

    def _take(
        self, channel: str, state: _Channel, group: str, members: _Group, consumer: str, limit: int
    ) -> list[Delivery]:
        now = self._clock()
        deliveries: list[Delivery] = []
        while members.cursor < state.end_seq and len(deliveries) < limit:
            seq = members.cursor
            payload = state.log[seq - state.first_seq]
            members.pending[seq] = _Pending(payload, consumer, now, 1)
            members.cursor += 1
            deliveries.append(Delivery(channel, group, str(seq), payload, 1))
        return deliveries

    async def _wait(self, state: _Channel, timeout_s: float) -> None:
        waiter = asyncio.get_running_loop().create_future()
        state.waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except TimeoutError:
            pass
        finally:
            if waiter in state.waiters:
                state.waiters.remove(waiter)

    @staticmethod
    def _wake(state: _Channel) -> None:
        waiters, state.waiters = state.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    @staticmethod
    def _trim(state: _Channel) -> None:
        # Keep everything some group has yet to read or ack; with no group yet,
        # keep it all so a consumer that starts late still sees it.
        if not state.groups:
            return
        keep_from = min(
            min(members.pending, default=members.cursor) for members in state.groups.values()
        )
        while state.first_seq < keep_from and state.log:
            state.log.popleft()
            state.first_seq += 1
