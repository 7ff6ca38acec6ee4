"""Triton's rate limiter (``workers.rate_limit``): instances whose needs add up past what
there is take turns, the one with the smaller weighted share first."""

from __future__ import annotations

import asyncio

import pytest

from workers.errors import ModelLoadError
from workers.rate_limit import Needs, RateLimiter, parse_resource

THREE = Needs((("R", 3),))


async def test_instances_needing_three_of_four_never_run_at_once() -> None:
    limiter = RateLimiter({"R": 4})
    limiter.register("a", THREE)
    running: list[str] = []
    overlaps: list[list[str]] = []

    async def run(instance: str) -> None:
        async with limiter.hold(instance, THREE):
            running.append(instance)
            if len(running) > 1:
                overlaps.append(list(running))
            await asyncio.sleep(0.001)
            running.remove(instance)

    await asyncio.gather(*(run(f"m{i % 3}#0") for i in range(30)))
    assert overlaps == [] and limiter.available("R") == 4


async def test_priority_one_runs_twice_as_often_as_priority_two_while_both_wait() -> None:
    limiter = RateLimiter()
    fast, slow = Needs((("R", 1),), priority=1), Needs((("R", 1),), priority=2)
    limiter.register("a", fast)
    limiter.register("b", slow)
    assert limiter.available("R") == 1  # not given: the most one instance needs
    order: list[str] = []

    async def run(instance: str, needs: Needs) -> None:
        async with limiter.hold(instance, needs):
            order.append(instance)
            await asyncio.sleep(0)

    await asyncio.gather(*(run("a", fast) for _ in range(20)), *(run("b", slow) for _ in range(20)))
    first = order[:15]  # while both still wait
    assert first.count("a") == 10 and first.count("b") == 5, order


async def test_a_cancelled_waiter_and_holder_give_their_share_back() -> None:
    limiter = RateLimiter({"R": 3})
    limiter.register("a", THREE)
    entered = asyncio.Event()

    async def hold_forever() -> None:
        async with limiter.hold("x", THREE):
            entered.set()
            await asyncio.sleep(3600)

    holder = asyncio.create_task(hold_forever())
    await entered.wait()
    waiter = asyncio.create_task(hold_forever())
    await asyncio.sleep(0)
    waiter.cancel()
    holder.cancel()
    await asyncio.gather(holder, waiter, return_exceptions=True)
    assert limiter.available("R") == 3
    async with limiter.hold("y", THREE):
        assert limiter.available("R") == 0


def test_a_need_past_what_is_given_fails_the_load_and_resources_parse() -> None:
    with pytest.raises(ModelLoadError, match="need 3 of resource 'R', but --rate-limit-resource gives 2"):
        RateLimiter({"R": 2}).register("m", THREE)
    assert parse_resource("GPU_MEM:4") == ("GPU_MEM", 4) and parse_resource("R:2:0") == ("R", 2)
    for bad in ("R", "R:x", ":3", "R:1:2:3"):
        with pytest.raises(ValueError, match="NAME:COUNT"):
            parse_resource(bad)
