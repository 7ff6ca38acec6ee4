"""Gateways and workers as separate processes joined by a shared broker.

``build_gateway_app`` is the HTTP gateway alone: it learns which models are
ready from the workers' heartbeats (``FleetReadiness``). ``run_worker`` is a
worker alone: it heartbeats, serves until SIGTERM or SIGINT, then drains.
Model control travels on the broker's control channel: the gateway publishes
loads and unloads, every worker applies them (``workers.control_listener``),
and readiness comes back through the heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from broker.errors import TransportError
from broker.transports import open_transport
from gateway.app import create_app
from gateway.admission import QueueLimits
from gateway.catalog import ModelCatalog
from gateway.control_client import ControlClient
from gateway.dashboard import build_dashboard
from gateway.management import ModelManager
from gateway.jobs import JobSettings, build_jobs
from gateway.embedded import ServeSettings, live_workers
from gateway.message_format import V2MessageFormat
from gateway.periodic import Periodic
from gateway.metrics import gateway_metrics
from gateway.worker_http import WorkerHealth, WorkerHttp, worker_http_app
from broker.replies import ReplyRouter
from gateway.service import InferenceService
from gateway.shared import open_heartbeats, open_job_gate, open_jobs_store, open_sessions
from gateway.tracing import gateway_tracer
from workers.control_listener import ControlListener
from workers.heartbeat import Heartbeat, HeartbeatSettings, HeartbeatStore, ServedModels
from workers.repository_poll import RepositoryPoller
from workers.repository import ModelRepository
from workers.telemetry.prometheus import StatsCollector
from workers.telemetry.settings import TelemetrySettings
from workers.telemetry.stats import StatsBook
from workers.telemetry.tracing import GATEWAY_SERVICE, WORKER_SERVICE, open_tracing
from workers.telemetry.wiring import worker_observers
from workers.worker import Worker, WorkerSettings

log = structlog.get_logger("ferry.fleet")


class FleetReadiness:
    """The union of the models live workers serve, refreshed in the background.

    Calling it returns the last snapshot, so readiness checks in the request
    path never wait on the broker.
    """

    def __init__(self, store: HeartbeatStore, refresh_s: float = 0.5) -> None:
        self._store = store
        self._served: ServedModels = {}
        self._workers: tuple[str, ...] = ()
        self._refresher = Periodic(self.refresh, refresh_s, "fleet-readiness")

    def __call__(self) -> ServedModels:
        return self._served

    def workers(self) -> tuple[str, ...]:
        """The workers whose heartbeats were current at the last refresh."""
        return self._workers

    async def start(self) -> None:
        await self._refresher.start()

    async def aclose(self) -> None:
        await self._refresher.aclose()

    async def refresh(self) -> None:
        try:
            workers = await self._store.live()
        except TransportError as exc:
            # A broker we cannot reach serves nothing.
            log.warning("fleet.refresh_failed", error=str(exc))
            workers = {}
        self._served = union(workers.values())
        self._workers = tuple(sorted(workers))


def union(served: Iterable[ServedModels]) -> ServedModels:
    merged: dict[str, set[int]] = {}
    for models in served:
        for name, versions in models.items():
            merged.setdefault(name, set()).update(versions)
    return {name: tuple(sorted(versions)) for name, versions in merged.items()}


@dataclass(frozen=True, slots=True)
class WorkerProcessSettings:
    model_repository: Path
    broker_url: str
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    heartbeat: HeartbeatSettings = HeartbeatSettings()
    job_store_url: str = ""
    session_store_url: str = ""
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)


def build_gateway_app(settings: ServeSettings, readiness_refresh_s: float = 0.5) -> Starlette:
    """The HTTP gateway alone; everything starts in its lifespan."""
    transport = open_transport(settings.broker_url)
    prefix = settings.service.channel_prefix
    heartbeats = open_heartbeats(settings.broker_url, transport, settings.gateway_id, prefix)
    assert heartbeats is not None, "a gateway alone needs a shared broker"
    readiness = FleetReadiness(heartbeats, readiness_refresh_s)
    router = ReplyRouter(transport, settings.gateway_id, settings.service.channel_prefix)
    catalog = ModelCatalog(ModelRepository(settings.model_repository), readiness,
                           settings.management.control.expected_models)
    limits = QueueLimits(transport, settings.service.channel_prefix)
    tracing = open_tracing(settings.telemetry.trace, GATEWAY_SERVICE)
    service = InferenceService(transport, router, catalog, settings.service, limits=limits,
                               tracer=gateway_tracer(tracing))
    store = open_jobs_store(settings.broker_url, settings.job_store_url, settings.job_ttl_s, prefix)
    jobs = build_jobs(transport, store, service, settings.gateway_id,
                      JobSettings(channel_prefix=settings.service.channel_prefix))
    # The local id is never live here: a gateway alone waits on the fleet's heartbeats.
    control = ControlClient(transport, settings.gateway_id, live_workers(heartbeats, ""), prefix)
    manager = ModelManager(catalog, control, settings.management)
    metrics = gateway_metrics(settings.telemetry, transport, catalog, readiness.workers, prefix)
    dashboard = build_dashboard(catalog, heartbeats.beats, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await router.start()
        await jobs.start()
        await readiness.start()
        await manager.start()
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
            await readiness.aclose()
            await jobs.aclose()
            await router.aclose()
            await heartbeats.aclose()
            await transport.aclose()
            if tracing is not None:
                await tracing.aclose()

    return create_app(service, settings.http, lifespan, jobs=jobs, manager=manager, metrics=metrics,
                      dashboard=dashboard)


async def run_worker(settings: WorkerProcessSettings) -> None:
    """Serve until SIGTERM/SIGINT, then finish and ack what is in flight."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    transport = open_transport(settings.broker_url)
    prefix = settings.worker.channel_prefix
    heartbeats = open_heartbeats(settings.broker_url, transport, settings.worker.worker_id, prefix)
    assert heartbeats is not None, "a worker alone needs a shared broker"
    job_gate = open_job_gate(settings.broker_url, settings.job_store_url, prefix)
    sessions = open_sessions(settings.broker_url, settings.worker.worker_id, heartbeats,
                             settings.session_store_url, prefix)
    repository = ModelRepository(settings.model_repository)
    stats = StatsBook() if settings.telemetry.metrics else None
    tracing = open_tracing(settings.telemetry.trace, WORKER_SERVICE)
    worker = Worker(transport, repository, settings.worker, job_gate=job_gate, message_format=V2MessageFormat(),
                    sessions=sessions, observer=worker_observers(settings.telemetry, stats, tracing))
    health = WorkerHealth()
    http = _worker_http(settings.telemetry, health, stats, worker.worker_id)
    heartbeat = Heartbeat(heartbeats, worker.worker_id, worker.ready_models, settings.heartbeat,
                          stats.to_wire if stats else None)
    control = settings.worker.control
    listener = ControlListener(transport, worker, control, prefix)
    poller = RepositoryPoller(repository, worker, control.poll_s)
    try:
        if http is not None:
            await http.start()  # liveness answers while models load
        await worker.start()
        await listener.start()
        if control.mode == "poll":
            await poller.start()
        await heartbeat.start()
        health.started()
        log.info("worker.started", worker_id=worker.worker_id, models=worker.ready_models())
        await stop.wait()
        health.draining()
        log.info("worker.stopping", worker_id=worker.worker_id)
        # Leave the fleet first so gateways stop counting on this worker.
        await heartbeat.aclose()
        await poller.aclose()
        await listener.aclose()
        await worker.drain()
    finally:
        await poller.aclose()
        await listener.aclose()
        await heartbeat.aclose()
        await worker.aclose()
        await sessions.aclose()
        await heartbeats.aclose()
        if job_gate is not None:
            await job_gate.aclose()
        await transport.aclose()
        if http is not None:
            await http.aclose()
        if tracing is not None:
            await tracing.aclose()
    log.info("worker.stopped", worker_id=worker.worker_id)


def _worker_http(settings: TelemetrySettings, health: WorkerHealth, stats: StatsBook | None,
                 worker_id: str) -> WorkerHttp | None:
    """The worker's /metrics and health probes on ``metrics_port`` (none when 0)."""
    if settings.metrics_port == 0:
        return None
    registry = None
    if stats is not None:
        registry = CollectorRegistry()
        registry.register(StatsCollector(stats, worker_id))
    return WorkerHttp(worker_http_app(health, registry), settings.metrics_host, settings.metrics_port)
