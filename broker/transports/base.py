"""What every transport does alike: it is an async context manager, ``fetch``
is ``fetch_first`` over one channel, once closed it refuses every call, and
its client library's errors leave it as ``broker.errors`` (``_guarded``), and
are counted (``failures``).

The seam is the ``Transport`` Protocol in ``broker.transport``; this class
only spares each implementation from writing these lines again.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar, Self

from broker.errors import TransportClosed, TransportError, translated
from broker.transport import Delivery, Headers


SETTLE_S = 2.0  # how long closing waits for the calls in flight to finish


class BaseTransport(ABC):
    service: ClassVar[str]  # names the transport in errors: "redis transport is closed"
    foreign_errors: ClassVar[tuple[type[BaseException], ...]] = ()  # the client library's, for _guarded

    def __init__(self) -> None:
        self._closed = False
        self._in_flight = 0  # calls inside _guarded now
        self._settled = asyncio.Event()  # set whenever none is
        self._settled.set()
        self.failures = 0  # calls that failed on the broker (not on closing) so far

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def fetch(
        self, channel: str, group: str, consumer: str, max_count: int, timeout_s: float
    ) -> list[Delivery]:
        return await self.fetch_first((channel,), group, consumer, max_count, timeout_s)

    async def ack_all(self, deliveries: Sequence[Delivery]) -> None:
        """One at a time here; a transport whose broker acks many at once overrides it."""
        for delivery in deliveries:
            await self.ack(delivery)

    async def reply(self, channel: str, payload: bytes, delivery: Delivery, *, key: str | None = None,
                    headers: Headers = ()) -> None:
        """Two steps here; a transport whose broker can do both in one round trip overrides it."""
        await self.publish(channel, payload, key=key, headers=headers)
        await self.ack(delivery)

    @abstractmethod
    async def publish(self, channel: str, payload: bytes, *, key: str | None = None,
                      headers: Headers = ()) -> str: ...

    @abstractmethod
    async def ack(self, delivery: Delivery) -> None: ...

    @abstractmethod
    async def fetch_first(
        self, channels: Sequence[str], group: str, consumer: str, max_count: int, timeout_s: float
    ) -> list[Delivery]: ...

    async def aclose(self) -> None:
        """Refuse further calls, then shut down; closing twice closes once."""
        if self._closed:
            return
        self._closed = True
        await self._shut_down()

    @abstractmethod
    async def _shut_down(self) -> None:
        """Release what the transport holds, waking any call waiting on it."""

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosed(f"{self.service} transport is closed")

    @contextmanager
    def _guarded(self) -> Iterator[None]:
        """Refuse if closed, and translate ``foreign_errors`` raised inside; counted in flight meanwhile."""
        self._check_open()
        self._in_flight += 1
        self._settled.clear()
        try:
            with translated(self.foreign_errors, self.service, lambda: self._closed):
                yield
        except TransportError:
            self.failures += 1
            raise
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._settled.set()

    async def _settle(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the calls in flight to finish (closing: before the client
        library's connections go, so that none of them is reopened by a call still under way)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._settled.wait()
        except TimeoutError:
            pass


async def wait_at_most(waiter: asyncio.Future[None], timeout_s: float) -> None:
    """Wait for ``waiter`` to be woken, or for ``timeout_s``, whichever comes first."""
    try:
        async with asyncio.timeout(timeout_s):
            await waiter
    except TimeoutError:
        pass
