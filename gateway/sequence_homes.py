"""Where a gateway sends a sequence's steps on a Redis fleet.

Workers answer each step of a sequence with the session channel of the
worker holding it (parameter ``sequence_channel``). Once a gateway knows a
sequence's channel it publishes later steps straight there, in order, so a
client may send steps without waiting for each answer. Until it knows, a
step waits for the one before it to be answered: a worker forwards a step
that reached it on the shared channel, and two steps forwarded by different
workers could overtake each other. A START for a sequence with a known home
goes there too, and restarts it there.

    async with homes.ordered(model, sequence_id):  # one step at a time, first come first served
        channel = await homes.channel(model, sequence_id)
        ...publish...
        done = homes.published(model, sequence_id)
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from contextlib import AbstractAsyncContextManager

from broker.envelope import Response, SequenceId
from workers.sequences.sessions import CHANNEL_PARAMETER, SequenceLocks

_KEPT = 65_536  # sequences remembered; the oldest are forgotten first

Key = tuple[str, SequenceId]


class SequenceHomes:
    def __init__(self) -> None:
        self._homes: OrderedDict[Key, str] = OrderedDict()
        self._last_step: dict[Key, asyncio.Future[None]] = {}
        self._locks = SequenceLocks()

    def ordered(self, model: str, sequence_id: SequenceId) -> AbstractAsyncContextManager[None]:
        return self._locks.hold(model, sequence_id)

    async def channel(self, model: str, sequence_id: SequenceId) -> str | None:
        """The channel to publish this step to (None: the model's request
        channel), once the steps before it allow it to go."""
        key = (model, sequence_id)
        previous = self._last_step.get(key)
        if key not in self._homes and previous is not None:
            await asyncio.shield(previous)
        return self._homes.get(key)

    def published(self, model: str, sequence_id: SequenceId) -> asyncio.Future[None]:
        """Mark a step in flight; resolve the returned future once it is answered."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last_step[(model, sequence_id)] = done
        return done

    def answered(self, model: str, sequence_id: SequenceId, end: bool, response: Response | None,
                 done: asyncio.Future[None]) -> None:
        key = (model, sequence_id)
        channel = response.parameters.get(CHANNEL_PARAMETER) if response is not None else None
        if end or response is None or response.error is not None:
            self._homes.pop(key, None)
        elif isinstance(channel, str) and channel:
            self._homes[key] = channel
            self._homes.move_to_end(key)
            while len(self._homes) > _KEPT:
                self._homes.popitem(last=False)
        if self._last_step.get(key) is done:
            del self._last_step[key]
        if not done.done():
            done.set_result(None)
