"""How a gateway orders a sequence's steps on a Redis fleet: until it knows
the sequence's session channel a step waits for the one before it; once it
knows, steps go straight there without waiting."""

from __future__ import annotations

import asyncio

from broker.envelope import ErrorInfo, Response
from gateway.sequence_homes import SequenceHomes


def reply(channel: str = "", error: bool = False) -> Response:
    return Response(id="r", model="m", parameters={"sequence_channel": channel} if channel else {},
                    error=ErrorInfo("invalid_argument", "no") if error else None)


async def publish(homes: SequenceHomes, log: list[str | None]) -> asyncio.Future[None]:
    async with homes.ordered("m", 1):
        log.append(await homes.channel("m", 1))
        return homes.published("m", 1)


async def test_a_step_waits_for_the_first_answer_then_goes_home() -> None:
    homes, log = SequenceHomes(), []
    first = await publish(homes, log)
    second = asyncio.create_task(publish(homes, log))
    await asyncio.sleep(0.01)
    assert log == [None], "the second step went before the first was answered"
    homes.answered("m", 1, False, reply("ferry.m.sessions.w1"), first)
    done = await second
    third = await publish(homes, log)  # the home is known: no waiting on the second
    assert log == [None, "ferry.m.sessions.w1", "ferry.m.sessions.w1"]
    assert not done.done() and not third.done()


async def test_an_error_or_the_end_forgets_the_home() -> None:
    homes, log = SequenceHomes(), []
    homes.answered("m", 1, False, reply("ferry.m.sessions.w1"), await publish(homes, log))
    homes.answered("m", 1, False, reply(error=True), await publish(homes, log))
    homes.answered("m", 1, True, reply("ferry.m.sessions.w1"), await publish(homes, log))
    await publish(homes, log)
    assert log == [None, "ferry.m.sessions.w1", None, None]


async def test_a_step_given_up_on_releases_the_next() -> None:
    homes, log = SequenceHomes(), []
    first = await publish(homes, log)
    second = asyncio.create_task(publish(homes, log))
    homes.answered("m", 1, False, None, first)  # its client timed out
    await second
    assert log == [None, None]
