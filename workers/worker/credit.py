"""Deliveries taken and not yet answered, counted against each model's credit.

Each delivery taken becomes a handler task that holds its model's credit in
two ways: as *computing* until its response is computed, and as *in hand* until
it is answered and acked (or left pending for another try). A model's consumer
fetches only while fewer than its ``limit`` (its instances' capacity times
``--prefetch``) are computing and fewer than its ``ceiling`` are in hand. So a
reply on its way to the broker (a Kafka produce waits for its acks, a few ms)
no longer keeps the next request from being fetched and computed meanwhile,
while what waits for compute in this worker stays bounded by ``limit``, the
rest left on the broker for an idle worker to take.

A delivery this worker is still handling is not handled twice: a claim of
stale deliveries can hand back one whose handler is only slow (a reply held
up while a Kafka partition finds a new leader, a batch longer than the
recovery's ``idle_s``), and a second handler would answer it a second time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import structlog

from broker.errors import TransportError
from broker.transport import Delivery

log = structlog.get_logger("ferry.worker")

# (model, delivery, computed): ``computed`` is called once the delivery's response is computed.
Handle = Callable[[str, Delivery, Callable[[], None]], Coroutine[Any, Any, None]]


class Credit:
    """How many more deliveries one model may take."""

    def __init__(self, limit: int, ceiling: int) -> None:
        self.limit = limit  # computing, or waiting to
        self.ceiling = ceiling  # in hand in all, computed ones whose replies are on their way included
        self.used = 0  # in hand
        self.computing = 0  # of those, not yet computed
        self.freed = asyncio.Event()

    @property
    def room(self) -> int:
        return max(0, min(self.limit - self.computing, self.ceiling - self.used))

    async def wait_for_room(self, active: Callable[[], bool]) -> None:
        while self.room == 0 and active():
            self.freed.clear()
            await self.freed.wait()

    async def wait_until_idle(self) -> None:
        while self.used:
            self.freed.clear()
            await self.freed.wait()


class InFlight:
    def __init__(self, handle: Handle, retry_after_s: float) -> None:
        self._handle = handle
        self._retry_after_s = retry_after_s
        self._credits: dict[str, Credit] = {}
        # Each running handler, by the (channel, message id) of the delivery it handles.
        self._handlers: dict[tuple[str, str], asyncio.Task[None]] = {}

    def credit(self, model: str) -> Credit | None:
        return self._credits.get(model)

    def size(self, model: str, limit: int, ceiling: int) -> Credit:
        credit = self._credits.setdefault(model, Credit(limit, ceiling))
        credit.limit, credit.ceiling = limit, max(limit, ceiling)
        credit.freed.set()
        return credit

    def forget(self, model: str) -> None:
        self._credits.pop(model, None)

    def wake(self, model: str) -> Credit:
        """Wake what waits on ``model``'s credit, to see that the worker's state changed."""
        credit = self._credits[model]
        credit.freed.set()
        return credit

    def wake_all(self) -> None:
        for model in self._credits:
            self.wake(model)

    def dispatch(self, model: str, deliveries: list[Delivery]) -> int:
        """Start a handler for each delivery not already being handled here; returns how many were started."""
        credit = self._credits[model]
        started = 0
        for delivery in deliveries:
            key = (delivery.channel, delivery.message_id)
            if key in self._handlers:
                continue
            hold = _Hold(credit)
            task = asyncio.create_task(self._handle(model, delivery, hold.computed))
            self._handlers[key] = task
            task.add_done_callback(partial(self._handler_done, hold=hold, key=key))
            started += 1
        return started

    async def join(self) -> None:
        await asyncio.gather(*self._handlers.values(), return_exceptions=True)

    def handling(self, channel: str) -> list[str]:
        """The message ids of ``channel`` whose handlers run now."""
        return [message_id for (held, message_id) in self._handlers if held == channel]

    def _handler_done(self, task: asyncio.Task[None], hold: _Hold, key: tuple[str, str]) -> None:
        self._handlers.pop(key, None)
        hold.settled()
        error = None if task.cancelled() else task.exception()
        if isinstance(error, TransportError):
            # The broker went away mid-delivery; what was not acked is claimed again once idle.
            log.warning("worker.handler_interrupted", error=str(error), retry_after_s=self._retry_after_s)
        elif error is not None:
            log.error("worker.handler_failed", error=repr(error))


class _Hold:
    """One delivery's share of its model's credit: computing until ``computed`` (or settled
    without it: an error, a forward, a stream's end), in hand until ``settled``."""

    __slots__ = ("_credit", "_computing")

    def __init__(self, credit: Credit) -> None:
        self._credit = credit
        self._computing = True
        credit.used += 1
        credit.computing += 1

    def computed(self) -> None:
        if self._computing:
            self._computing = False
            self._credit.computing -= 1
            self._credit.freed.set()

    def settled(self) -> None:
        self.computed()
        self._credit.used -= 1
        self._credit.freed.set()
