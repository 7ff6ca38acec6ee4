"""A coroutine run every ``interval_s`` on a task of its own, from ``start`` until ``aclose``.

Used by the gateway's background readers (fleet readiness, queue backlog, the
dashboard's sampler). A tick that raises is logged and the next one still runs:
a reader that dies would leave its numbers frozen without anyone noticing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger("ferry.periodic")


class Periodic:
    def __init__(self, tick: Callable[[], Awaitable[None]], interval_s: float, name: str) -> None:
        self._tick = tick
        self._interval_s = interval_s
        self._name = name
        self._task: asyncio.Task[None] | None = None

    async def start(self, *, first_in_background: bool = False) -> None:
        """Tick once (awaited, unless ``first_in_background``), then every interval."""
        if not first_in_background:
            await self._tick()
        self._task = asyncio.create_task(self._run(tick_now=first_in_background), name=self._name)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self, tick_now: bool) -> None:
        if tick_now:
            await self._safe_tick()
        while True:
            await asyncio.sleep(self._interval_s)
            await self._safe_tick()

    async def _safe_tick(self) -> None:
        try:
            await self._tick()
        except Exception:
            log.exception("periodic.tick_failed", task=self._name)
