"""A worker's periodic upkeep, every ``recovery.interval_s``.

It claims deliveries a dead consumer left pending on the request channels and
handles them like fresh ones (see ``workers.recovery``), trims what every
group has acked, and takes over dead workers' session channels (see
``workers.sequences.sessions``), handling what they left pending before reading
anything new there.

On a broker where other workers would take over a request this one still
computes once it has been unacked for ``recovery.idle_s`` (Redis), it renews
those it handles that have been unacked half that long, their delivery counts
kept: a batch slower than the claim threshold is computed once, by the worker
that has it, while that worker lives (without renewal the worker's own claims
took it back each threshold, counting a delivery each time, so a worker that
then died left it dead-lettered as delivered too often).
"""

from __future__ import annotations

import asyncio

import structlog

from broker import channels
from broker.errors import TransportClosed, TransportError
from broker.transport import Reclaiming, Renewing, Transport
from workers.model_set import ModelSet
from workers.sequences.sessions import SessionRouting
from workers.worker.consumer import Active, Channels
from workers.worker.credit import InFlight
from workers.worker.settings import WorkerSettings

log = structlog.get_logger("ferry.worker")


class Upkeep:
    def __init__(self, transport: Transport, settings: WorkerSettings, models: ModelSet, channels_of: Channels,
                 sessions: SessionRouting, in_flight: InFlight, active: Active) -> None:
        self._transport = transport
        self._settings = settings
        self._models = models
        self._channels = channels_of
        self._sessions = sessions
        self._in_flight = in_flight
        self._active = active
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = self._task or asyncio.create_task(self._maintain(), name="maintain")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self._settings.recovery.interval_s)
            for model in self._models.names():
                if self._active(model):
                    await self._tidy(model)
            await self._adopt_sessions()

    async def _tidy(self, model: str) -> None:
        # Only request channels: what sits pending on a session channel is
        # this worker's own work, already being handled in sequence order.
        for channel in self._channels.requests(model):
            if isinstance(self._transport, Renewing):
                await self._renew(self._transport, model, channel)
            if isinstance(self._transport, Reclaiming):
                await self._reclaim(self._transport, model, channel, self._settings.recovery.idle_s)
        for channel in self._channels.all(model):
            await self._trim(channel)

    async def _adopt_sessions(self) -> None:
        try:
            adopted = await self._sessions.maintain([m for m in self._models.names() if self._models.stateful(m)])
        except TransportError as exc:
            log.warning("worker.sessions_failed", error=str(exc))
            return
        if not isinstance(self._transport, Reclaiming):
            return
        for model, adopted_channels in adopted.items():
            for channel in adopted_channels:
                await self._reclaim(self._transport, model, channel, 0.0, limit=self._settings.max_in_flight)

    async def _reclaim(self, transport: Reclaiming, model: str, channel: str, idle_s: float,
                       limit: int | None = None) -> None:
        credit = self._in_flight.credit(model)
        if credit is None or not self._active(model):
            return
        room = limit if limit is not None else min(self._settings.fetch_count, credit.room)
        if room <= 0:
            return
        group = channels.worker_group(model, self._settings.channel_prefix)
        worker_id = self._settings.worker_id
        try:
            deliveries = await transport.claim_stale(channel, group, worker_id, idle_s, room)
        except TransportClosed:
            return
        except Exception as exc:
            log.warning("worker.claim_failed", channel=channel, error=str(exc))
            return
        if not deliveries:
            return
        if self._in_flight.credit(model) is None or not self._active(model):
            # Unloaded while we claimed: left pending, another worker serving it claims them once idle.
            log.info("worker.claim_dropped", channel=channel, count=len(deliveries), worker_id=worker_id)
            return
        started = self._in_flight.dispatch(model, deliveries)
        if started < len(deliveries):
            # Slow, not lost: their handlers here answer and ack them.
            log.info("worker.claimed_in_hand", channel=channel, count=len(deliveries) - started, worker_id=worker_id)
        if started:
            log.info("worker.claimed", channel=channel, count=started, worker_id=worker_id)

    @property
    def _renew_after_s(self) -> float:
        """Renewed once unacked half the claim threshold, or sooner where upkeep comes round less
        often than that: two rounds before the threshold at the latest."""
        recovery = self._settings.recovery
        return max(0.0, min(recovery.idle_s / 2, recovery.idle_s - 2 * recovery.interval_s))

    async def _renew(self, transport: Renewing, model: str, channel: str) -> None:
        handling = self._in_flight.handling(channel)
        if not handling:
            return
        group = channels.worker_group(model, self._settings.channel_prefix)
        try:
            renewed = await transport.renew(channel, group, self._settings.worker_id, handling, self._renew_after_s)
        except TransportClosed:
            return
        except Exception as exc:
            log.warning("worker.renew_failed", channel=channel, error=str(exc))
            return
        if renewed:
            log.debug("worker.renewed", channel=channel, count=renewed)

    async def _trim(self, channel: str) -> None:
        try:
            await self._transport.trim(channel)
        except TransportClosed:
            return
        except Exception as exc:
            log.warning("worker.trim_failed", channel=channel, error=str(exc))
