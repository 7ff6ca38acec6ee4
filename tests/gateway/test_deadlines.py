"""Deadlines: many reply timeouts on one timer."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.deadlines import Deadlines


async def test_a_watch_past_its_timeout_ends_in_timeout_error_soon_after():
    deadlines = Deadlines(0.1)
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        with deadlines.watch():
            await asyncio.sleep(5)
    waited = time.monotonic() - began
    assert 0.1 <= waited < 0.1 + deadlines.tick_s + 0.1, waited


async def test_a_watch_that_finishes_in_time_is_left_alone_and_the_task_can_wait_on():
    deadlines = Deadlines(0.1)
    with deadlines.watch():
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)  # past the first watch's deadline: nothing cancels this task now
    assert not deadlines._watched


async def test_only_the_overdue_watches_of_many_expire():
    deadlines = Deadlines(0.2)
    outcomes: dict[int, str] = {}

    async def request(n: int, takes_s: float) -> None:
        try:
            with deadlines.watch():
                await asyncio.sleep(takes_s)
            outcomes[n] = "answered"
        except TimeoutError:
            outcomes[n] = "timed out"

    await asyncio.gather(*(request(n, 0.05 if n % 2 else 2.0) for n in range(50)))
    assert outcomes == {n: "answered" if n % 2 else "timed out" for n in range(50)}


async def test_a_cancellation_from_elsewhere_stays_a_cancellation():
    deadlines = Deadlines(5.0)

    async def waits() -> None:
        with deadlines.watch():
            await asyncio.sleep(10)

    task = asyncio.create_task(waits())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not deadlines._watched


def test_one_deadlines_serves_the_loop_it_is_used_in_after_another_has_closed():
    deadlines = Deadlines(0.05)

    async def quick() -> None:
        with deadlines.watch():  # arms the timer on this loop, which closes before it fires
            await asyncio.sleep(0)

    async def times_out() -> bool:
        try:
            with deadlines.watch():
                await asyncio.sleep(1)
        except TimeoutError:
            return True
        return False

    asyncio.run(quick())
    assert asyncio.run(times_out())
