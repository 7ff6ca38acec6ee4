"""Fetching each served model's channels while its credit has room.

A model with priority levels has a request channel per level, and a stateful
model also reads its session channels; ``fetch_first`` drains them in the
order given. What is fetched goes to ``InFlight.dispatch``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from broker import channels
from broker.errors import TransportClosed
from broker.transport import Transport
from workers.model_set import ModelSet
from workers.sequences.sessions import SessionRouting
from workers.worker.credit import Credit, InFlight
from workers.worker.settings import WorkerSettings

log = structlog.get_logger("ferry.worker")

Active = Callable[[str], bool]  # whether a model is still consumed (not unloading, worker not stopping)


class Channels:
    """The channels each model's deliveries are read from."""

    def __init__(self, models: ModelSet, sessions: SessionRouting, prefix: str) -> None:
        self._models = models
        self._sessions = sessions
        self._prefix = prefix

    def requests(self, model: str) -> tuple[str, ...]:
        return channels.request_channels(model, self._models.priority_levels(model), self._prefix)

    def all(self, model: str) -> tuple[str, ...]:
        """Session channels first: they carry sequences already under way."""
        sessions = self._sessions.channels(model) if self._models.stateful(model) else ()
        return (*sessions, *self.requests(model))


class Consumer:
    def __init__(self, transport: Transport, settings: WorkerSettings, channels_of: Channels,
                 in_flight: InFlight, active: Active) -> None:
        self._transport = transport
        self._settings = settings
        self._channels = channels_of
        self._in_flight = in_flight
        self._active = active
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, model: str, credit: Credit) -> None:
        if model not in self._tasks:
            self._tasks[model] = asyncio.create_task(self._consume(model, credit), name=f"consume-{model}")

    async def stop(self, model: str) -> None:
        """Wait for ``model``'s consumer to end (see ``Active``)."""
        await asyncio.gather(self._tasks.pop(model), return_exceptions=True)

    async def join(self) -> None:
        """Wait for every consumer to end; each finishes the fetch it is in (at most
        poll_timeout_s), so nothing the broker already handed over is left unhandled."""
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def cancel(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await self.join()

    async def _consume(self, model: str, credit: Credit) -> None:
        group = channels.worker_group(model, self._settings.channel_prefix)
        while self._active(model):
            names = self._channels.all(model)  # grows when a dead worker's sessions are adopted
            await credit.wait_for_room(lambda: self._active(model))
            if not self._active(model):
                return
            limit = min(self._settings.fetch_count, credit.room)
            try:
                deliveries = await self._transport.fetch_first(
                    names, group, self._settings.worker_id, limit, self._settings.poll_timeout_s
                )
            except TransportClosed:
                return
            except Exception as exc:
                log.warning("worker.fetch_failed", channels=names, error=str(exc))
                await asyncio.sleep(0.5)
                continue
            self._in_flight.dispatch(model, deliveries)
