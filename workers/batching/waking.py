"""Sleeping in a batcher's loop until the next batch is due or new work arrives."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def sleep_until(due: float | None, wakeup: asyncio.Event, clock: Callable[[], float]) -> None:
    """Return at ``due`` (on ``clock``; None: no deadline) or once ``wakeup`` is set, if sooner.

    The event is cleared first, so only a ``set()`` made while asleep wakes it early.
    """
    wakeup.clear()
    timeout = None if due is None else max(0.0, due - clock())
    try:
        async with asyncio.timeout(timeout):
            await wakeup.wait()
    except TimeoutError:
        pass
