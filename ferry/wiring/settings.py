"""What each process of ferry is started with, built once by the command line."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

from broker.claims.check import ClaimSettings
from gateway.app import HttpSettings
from gateway.grpc.server import GrpcSettings
from gateway.jobs import DEFAULT_TTL_S
from gateway.management import ManagementSettings
from gateway.platforms.sagemaker import SageMakerSettings
from gateway.platforms.vertex import VertexSettings
from gateway.service import ServiceSettings
from workers.cache.settings import CacheSettings
from workers.heartbeat import HeartbeatSettings
from workers.telemetry.settings import TelemetrySettings
from workers.worker import WorkerSettings


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """``ferry serve`` (gateway and worker) and ``ferry gateway`` (``worker`` unused)."""

    model_repository: Path
    broker_url: str = "memory://"
    gateway_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    http: HttpSettings = HttpSettings()
    grpc: GrpcSettings = GrpcSettings()
    service: ServiceSettings = ServiceSettings()
    worker: WorkerSettings = WorkerSettings()
    heartbeat: HeartbeatSettings = HeartbeatSettings()
    job_ttl_s: float = DEFAULT_TTL_S
    job_store_url: str = ""  # default: the broker's Redis, else this process
    claim_store_url: str = ""  # default: the broker's Redis, else the job store's, else none
    claims: ClaimSettings = ClaimSettings()
    management: ManagementSettings = ManagementSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    cache: CacheSettings | None = None  # --cache-config: the worker's response cache
    sagemaker: SageMakerSettings | None = None  # SageMaker's routes on a port of their own
    vertex: VertexSettings | None = None  # Vertex AI's routes on a port of their own

    @property
    def platform_ports(self) -> tuple[int, ...]:
        return tuple(p.port for p in (self.sagemaker, self.vertex) if p is not None)


@dataclass(frozen=True, slots=True)
class WorkerProcessSettings:
    """``ferry worker``: a worker alone on a shared broker."""

    model_repository: Path
    broker_url: str
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    heartbeat: HeartbeatSettings = HeartbeatSettings()
    job_store_url: str = ""
    session_store_url: str = ""
    claim_store_url: str = ""
    claims: ClaimSettings = ClaimSettings()
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    cache: CacheSettings | None = None
