"""The gateway side of a process, built once for ``ferry serve`` and ``ferry gateway``.

Both put an HTTP front door on the same objects: the reply router, the
inference and job services, model control, metrics and the dashboard. What
differs is only where readiness, live workers and their heartbeats come from,
and those are passed in.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.types import ASGIApp

from broker.claims.check import Claims
from broker.replies import ReplyRouter
from broker.transport import Transport
from ferry.wiring.lifecycle import close_later, start_all
from ferry.wiring.settings import ServeSettings
from gateway.admission import QueueLimits
from gateway.app import Lifespan, create_app
from gateway.catalog import ModelCatalog
from gateway.dashboard import Dashboard, build_dashboard
from gateway.dashboard_sampler import WorkerBeats
from gateway.jobs import JobService, JobSettings, JobStore, build_jobs
from gateway.management import ModelManager
from gateway.metrics import GatewayMetrics, LiveWorkers, LostCollector, gateway_metrics
from gateway.service import InferenceService, LocalWorker
from gateway.grpc.server import GrpcServer
from gateway.grpc.servicer import GrpcParts
from gateway.logs import PROCESS_LOGS
from gateway.platforms.ports import PortDispatch
from gateway.platforms.sagemaker import SageMakerApp
from gateway.platforms.vertex import VertexApp
from gateway.shared_memory.regions import SharedMemoryRegions
from gateway.statistics import Statistics
from gateway.tracing import gateway_tracer
from workers.control.client import ControlClient
from workers.telemetry.tracing.control import TraceControl
from workers.telemetry.stats import StatsBook

if TYPE_CHECKING:  # opentelemetry is imported only when tracing is on
    from workers.telemetry.tracing.provider import Tracing


@dataclass(frozen=True, slots=True)
class Sources:
    """Where the gateway side learns about workers: the ids live now, their
    beats for the dashboard, and, for ``ferry serve``, the local worker's stats."""

    workers: LiveWorkers
    beats: WorkerBeats
    stats: StatsBook | None = None
    local_worker: str = ""


@dataclass(frozen=True, slots=True)
class GatewaySide:
    router: ReplyRouter
    service: InferenceService
    jobs: JobService
    manager: ModelManager
    metrics: GatewayMetrics | None
    dashboard: Dashboard
    regions: SharedMemoryRegions
    statistics: Statistics
    traces: TraceControl  # off for good in a process that exports no spans
    grpc: GrpcServer | None

    @classmethod
    def build(cls, settings: ServeSettings, transport: Transport, catalog: ModelCatalog, store: JobStore,
              control: ControlClient, sources: Sources, tracing: Tracing | None, claims: Claims,
              local: LocalWorker | None = None) -> GatewaySide:
        """``local``: the worker of this process, given requests straight (``gateway.service``)."""
        prefix = settings.service.channel_prefix
        router = ReplyRouter(transport, settings.gateway_id, prefix, claims=claims)
        service = InferenceService(transport, router, catalog, settings.service,
                                   limits=QueueLimits(transport, prefix), tracer=gateway_tracer(tracing),
                                   claims=claims, local=local)
        jobs = build_jobs(transport, store, service, settings.gateway_id, JobSettings(channel_prefix=prefix))
        metrics = gateway_metrics(settings.telemetry, transport, catalog, sources.workers,
                                  LostCollector(router.lost, jobs.lost), prefix, sources.stats, sources.local_worker)
        manager = ModelManager(catalog, control, settings.management)
        regions = SharedMemoryRegions(settings.http.allow_client_shm)
        statistics = Statistics(catalog, sources.beats)
        traces = tracing.control if tracing is not None else TraceControl(enabled=False)
        grpc = None
        if settings.grpc.enabled:
            parts = GrpcParts(service, manager, regions, statistics, PROCESS_LOGS, traces, settings.http.server_name)
            grpc = GrpcServer(parts, settings.grpc)
        return cls(router, service, jobs, manager, metrics, build_dashboard(catalog, sources.beats, metrics),
                   regions, statistics, traces, grpc)

    def app(self, settings: ServeSettings, lifespan: Lifespan) -> ASGIApp:
        """The V2 app; with a platform contract on, that contract's app answers on its own port."""
        main = create_app(self.service, settings.http, lifespan, jobs=self.jobs, manager=self.manager,
                          metrics=self.metrics, dashboard=self.dashboard, regions=self.regions,
                          statistics=self.statistics, traces=self.traces)
        platforms: dict[int, ASGIApp] = {}
        if settings.sagemaker is not None:
            platforms[settings.sagemaker.port] = SageMakerApp(main, self.service.catalog, self.manager,
                                                              settings.sagemaker).app()
        if settings.vertex is not None:
            platforms[settings.vertex.port] = VertexApp(main, self.service.catalog, settings.vertex).app()
        return PortDispatch(main, platforms) if platforms else main

    async def start(self, stack: AsyncExitStack) -> None:
        """Start each part and have ``stack`` close it, in the reverse order."""
        close_later(stack, self.regions)  # closed last: no request is left to use a region
        await start_all(stack, self.router, self.jobs, self.manager, self.metrics, self.dashboard, self.grpc)
