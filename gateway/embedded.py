"""``ferry serve``: gateway, worker and broker in one process and one event loop.

On a shared broker (``redis://`` or ``kafka://``) the worker also heartbeats, so gateways
started elsewhere with ``ferry gateway`` count it as serving its models.

Model control (``ServeSettings.management``) goes through the broker's control
channel even in one process, so ``ferry serve`` loads and unloads exactly as a
fleet does.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette

from broker.transport import Transport
from broker.transports import open_transport
from gateway.app import HttpSettings, create_app
from gateway.admission import QueueLimits
from gateway.catalog import ModelCatalog
from gateway.control_client import ControlClient
from gateway.dashboard import build_dashboard, local_beats
from gateway.management import ManagementSettings, ModelManager
from gateway.jobs import DEFAULT_TTL_S, JobSettings, build_jobs
from gateway.message_format import V2MessageFormat
from gateway.metrics import gateway_metrics
from broker.replies import ReplyRouter
from gateway.service import InferenceService, ServiceSettings
from gateway.shared import open_heartbeats, open_jobs_store
from gateway.tracing import gateway_tracer
from workers.control_listener import ControlListener
from workers.heartbeat import Heartbeat, HeartbeatSettings, HeartbeatStore
from workers.repository_poll import RepositoryPoller
from workers.repository import ModelRepository
from workers.telemetry.settings import TelemetrySettings
from workers.telemetry.stats import StatsBook
from workers.telemetry.tracing import SERVE_SERVICE, open_tracing
from workers.telemetry.wiring import worker_observers
from workers.worker import Worker, WorkerSettings


@dataclass(frozen=True, slots=True)
class ServeSettings:
    model_repository: Path
    broker_url: str = "memory://"
    gateway_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    http: HttpSettings = HttpSettings()
    service: ServiceSettings = ServiceSettings()
    worker: WorkerSettings = WorkerSettings()
    heartbeat: HeartbeatSettings = HeartbeatSettings()
    job_ttl_s: float = DEFAULT_TTL_S
    job_store_url: str = ""  # default: the broker's Redis, else this process
    management: ManagementSettings = ManagementSettings()
    telemetry: TelemetrySettings = TelemetrySettings()


def build_app(settings: ServeSettings, transport: Transport | None = None) -> Starlette:
    """The whole stack as an ASGI app; everything starts in its lifespan."""
    transport = transport or open_transport(settings.broker_url)
    repository = ModelRepository(settings.model_repository)
    store = open_jobs_store(settings.broker_url, settings.job_store_url, settings.job_ttl_s,
                            settings.service.channel_prefix)
    stats = StatsBook() if settings.telemetry.metrics else None
    tracing = open_tracing(settings.telemetry.trace, SERVE_SERVICE)
    worker = Worker(transport, repository, settings.worker, job_gate=store, message_format=V2MessageFormat(),
                    observer=worker_observers(settings.telemetry, stats, tracing))
    router = ReplyRouter(transport, settings.gateway_id, settings.service.channel_prefix)
    catalog = ModelCatalog(repository, worker.ready_models, settings.management.control.expected_models)
    limits = QueueLimits(transport, settings.service.channel_prefix)
    service = InferenceService(transport, router, catalog, settings.service, limits=limits,
                               tracer=gateway_tracer(tracing))
    jobs = build_jobs(transport, store, service, settings.gateway_id,
                      JobSettings(channel_prefix=settings.service.channel_prefix))
    heartbeats = open_heartbeats(settings.broker_url, transport, settings.worker.worker_id,
                                 settings.worker.channel_prefix)
    heartbeat = None if heartbeats is None else Heartbeat(
        heartbeats, worker.worker_id, worker.ready_models, settings.heartbeat, stats.to_wire if stats else None
    )
    prefix = settings.service.channel_prefix
    listener = ControlListener(transport, worker, settings.worker.control, prefix)
    control = ControlClient(transport, settings.gateway_id, live_workers(heartbeats, worker.worker_id), prefix)
    manager = ModelManager(catalog, control, settings.management)
    poller = RepositoryPoller(repository, worker, settings.worker.control.poll_s)
    polling = settings.worker.control.mode == "poll"
    # The local worker is live while this process is; workers elsewhere have their own /metrics.
    metrics = gateway_metrics(settings.telemetry, transport, catalog, lambda: (worker.worker_id,), prefix,
                              stats, worker.worker_id)
    dashboard = build_dashboard(catalog, heartbeats.beats if heartbeats else local_beats(
        worker.worker_id, worker.ready_models, stats.to_wire if stats else None), metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await router.start()
        await jobs.start()
        await worker.start(catalog.index)
        await listener.start()
        if polling:
            await poller.start()
        await manager.start()
        if heartbeat is not None:
            await heartbeat.start()
        if metrics is not None:
            await metrics.start()
        await dashboard.start()
        try:
            yield
        finally:
            await dashboard.aclose()
            if metrics is not None:
                await metrics.aclose()
            await manager.aclose()
            await poller.aclose()
            await listener.aclose()
            if heartbeat is not None:
                # On a shared broker, what this worker took must still be answered.
                await heartbeat.aclose()
                await worker.drain()
            await worker.aclose()
            if heartbeats is not None:
                await heartbeats.aclose()
            await jobs.aclose()
            await router.aclose()
            await transport.aclose()
            if tracing is not None:
                await tracing.aclose()

    return create_app(service, settings.http, lifespan, jobs=jobs, manager=manager, metrics=metrics,
                      dashboard=dashboard)


def live_workers(heartbeats: HeartbeatStore | None, local_worker: str) -> Callable[[], Awaitable[set[str]]]:
    """Who must answer a control message: every live worker, or the one in this process."""

    async def live() -> set[str]:
        return {local_worker} if heartbeats is None else set(await heartbeats.live())

    return live
