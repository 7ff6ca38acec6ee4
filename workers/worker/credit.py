"""Deliveries taken and not yet answered, counted against each model's credit.

Each delivery taken becomes a handler task holding one unit of its model's
credit until it is answered and acked (or left pending for another try); a
model's consumer fetches only while its credit has room.

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

Handle = Callable[[str, Delivery], Coroutine[Any, Any, None]]  # (model, delivery)


class Credit:
    """How many more deliveries one model may take."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.freed = asyncio.Event()

    @property
    def room(self) -> int:
        return max(0, self.limit - self.used)

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

    def size(self, model: str, limit: int) -> Credit:
        credit = self._credits.setdefault(model, Credit(limit))
        credit.limit = limit
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
            credit.used += 1
            task = asyncio.create_task(self._handle(model, delivery))
            self._handlers[key] = task
            task.add_done_callback(partial(self._handler_done, credit=credit, key=key))
            started += 1
        return started

    async def join(self) -> None:
        await asyncio.gather(*self._handlers.values(), return_exceptions=True)

    def handling(self, channel: str) -> list[str]:
        """The message ids of ``channel`` whose handlers run now."""
        return [message_id for (held, message_id) in self._handlers if held == channel]

    def _handler_done(self, task: asyncio.Task[None], credit: Credit, key: tuple[str, str]) -> None:
        self._handlers.pop(key, None)
        credit.used -= 1
        credit.freed.set()
        error = None if task.cancelled() else task.exception()
        if isinstance(error, TransportError):
            # The broker went away mid-delivery; what was not acked is claimed again once idle.
            log.warning("worker.handler_interrupted", error=str(error), retry_after_s=self._retry_after_s)
        elif error is not None:
            log.error("worker.handler_failed", error=repr(error))
