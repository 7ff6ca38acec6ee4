"""The worker side of a process, built once for ``ferry serve`` and ``ferry worker``:
the worker, its control-channel listener, the repository poller and the heartbeat."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.claims.check import Claims, NoClaims
from broker.transport import Transport
from ferry.wiring.lifecycle import close_later, start_all
from workers.cache.cached import AnswerCache
from workers.control.listener import ControlListener
from workers.formats.v2_json import V2MessageFormat
from workers.heartbeat import Heartbeat, HeartbeatSettings, HeartbeatStore
from workers.rate_limit import RateLimiter
from workers.repository.layout import ModelRepository, RepositoryIndex
from workers.repository.poll import RepositoryPoller
from workers.sequences.sessions import SessionRouting
from workers.telemetry.settings import TelemetrySettings
from workers.telemetry.stats import StatsBook
from workers.telemetry.wiring import worker_observers
from workers.worker import JobGate, Worker, WorkerSettings

if TYPE_CHECKING:  # opentelemetry is imported only when tracing is on
    from workers.telemetry.tracing.provider import Tracing


@dataclass(frozen=True, slots=True)
class WorkerSide:
    worker: Worker
    listener: ControlListener
    poller: RepositoryPoller | None
    stats: StatsBook | None

    @classmethod
    def build(cls, transport: Transport, repository: ModelRepository, settings: WorkerSettings,
              telemetry: TelemetrySettings, tracing: Tracing | None, job_gate: JobGate | None,
              sessions: SessionRouting | None = None, claims: Claims = NoClaims(),
              cache: AnswerCache | None = None) -> WorkerSide:
        stats = StatsBook() if telemetry.metrics else None
        # V2 JSON as well as envelopes: external producers write requests straight onto the channels.
        limiter = RateLimiter(dict(settings.rate_limit_resources)) if settings.rate_limit == "execution_count" else None
        worker = Worker(transport, repository, settings, job_gate=job_gate, message_format=V2MessageFormat(),
                        sessions=sessions, observer=worker_observers(telemetry, stats, tracing), claims=claims,
                        cache=cache, limiter=limiter)
        control = settings.control
        poller = RepositoryPoller(repository, worker, control.poll_s) if control.mode == "poll" else None
        return cls(worker, ControlListener(transport, worker, control, settings.channel_prefix), poller, stats)

    def heartbeat(self, store: HeartbeatStore, settings: HeartbeatSettings) -> Heartbeat:
        return Heartbeat(store, self.worker.worker_id, self.worker.ready_models, settings,
                         self.stats.to_wire if self.stats else None)

    async def start(self, stack: AsyncExitStack, index: RepositoryIndex | None = None, drain: bool = True) -> None:
        """Load the models and start consuming; ``stack`` stops it all again,
        first draining (with ``drain``): on a shared broker, what this worker
        took must still be answered."""
        await self.worker.start(index)
        close_later(stack, self.worker)
        if drain:
            stack.push_async_callback(self.worker.drain)
        await start_all(stack, self.listener, self.poller)
