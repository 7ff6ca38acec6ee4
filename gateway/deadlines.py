"""Reply timeouts for many requests at once, on one timer.

``asyncio.timeout`` schedules a timer per request and cancels it when the reply
comes, which on uvloop costs a timer handle allocated, put in libuv's heap and
closed again: a few percent of a small request's CPU, for a timeout (minutes)
that almost never fires. ``Deadlines`` keeps the requests it watches in the
order they began; since they all share one timeout, that is the order they
fall due. One timer, armed while anything is watched, wakes every ``tick_s``
and cancels the tasks whose time is up; a watch then ends in ``TimeoutError``,
as ``asyncio.timeout``'s does, between ``timeout_s`` and ``timeout_s + tick_s``
after it began. A cancellation from elsewhere still ends it in
``CancelledError``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType


class Deadlines:
    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.tick_s = max(0.005, min(1.0, timeout_s / 10))
        self._clock = clock
        self._watched: dict[Watch, None] = {}  # in the order they began, so in the order they fall due
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self) -> Watch:
        """``with deadlines.watch():`` around what must finish within ``timeout_s``, in a task."""
        return Watch(self)

    def _current_task(self) -> asyncio.Task[object]:
        # Given the loop, current_task need not look for the running one: on Python 3.11 that
        # costs a getpid() system call (its check for a fork), a few percent of a small request.
        task = asyncio.current_task(self._loop) if self._loop is not None else None
        if task is None:  # not in a task of the loop last used
            task = asyncio.current_task()
            if task is None:
                raise RuntimeError("Deadlines.watch() is for use inside a task")
        return task

    def _add(self, watch: Watch, loop: asyncio.AbstractEventLoop) -> None:
        self._watched[watch] = None
        if self._timer is None or self._loop is not loop:  # a new loop: the old one's timer is gone with it
            self._loop = loop
            self._timer = loop.call_later(self.tick_s, self._sweep)

    def _remove(self, watch: Watch) -> None:
        self._watched.pop(watch, None)

    def _sweep(self) -> None:
        self._timer = None
        now = self._clock()
        while self._watched:
            watch = next(iter(self._watched))  # the oldest: only the overdue ones are looked at
            if watch.due > now:
                break
            del self._watched[watch]
            watch.expire()
        if self._watched and self._loop is not None:
            self._timer = self._loop.call_later(self.tick_s, self._sweep)


class Watch:
    __slots__ = ("_deadlines", "_task", "_cancelling", "due", "expired")

    def __init__(self, deadlines: Deadlines) -> None:
        self._deadlines = deadlines
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self.due = 0.0
        self.expired = False

    def __enter__(self) -> Watch:
        deadlines = self._deadlines
        task = deadlines._current_task()
        self._task, self._cancelling = task, task.cancelling()
        self.due = deadlines._clock() + deadlines.timeout_s
        deadlines._add(self, task.get_loop())
        return self

    def expire(self) -> None:
        assert self._task is not None
        self.expired = True
        self._task.cancel()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._deadlines._remove(self)
        if not self.expired:
            return
        assert self._task is not None
        # Ours was the cancellation, and no other is pending: it ends as a timeout.
        if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
