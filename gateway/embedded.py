"""``ferry serve``: gateway, worker and broker in one process and one event loop."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette

from broker.transport import Transport
from broker.transports import open_transport
from gateway.app import HttpSettings, create_app
from gateway.catalog import ModelCatalog
from gateway.replies import ReplyRouter
from gateway.service import InferenceService, ServiceSettings
from workers.repository import ModelRepository
from workers.worker import Worker, WorkerSettings


@dataclass(frozen=True, slots=True)
class ServeSettings:
    model_repository: Path
    broker_url: str = "memory://"
    gateway_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    http: HttpSettings = HttpSettings()
    service: ServiceSettings = ServiceSettings()
    worker: WorkerSettings = WorkerSettings()


def build_app(settings: ServeSettings, transport: Transport | None = None) -> Starlette:
    """The whole stack as an ASGI app; everything starts in its lifespan."""
    transport = transport or open_transport(settings.broker_url)
    repository = ModelRepository(settings.model_repository)
    worker = Worker(transport, repository, settings.worker)
    router = ReplyRouter(transport, settings.gateway_id, settings.service.channel_prefix)
    catalog = ModelCatalog(repository, worker.ready_models)
    service = InferenceService(transport, router, catalog, settings.service)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await router.start()
        await worker.start(catalog.index)
        try:
            yield
        finally:
            await worker.aclose()
            await router.aclose()
            await transport.aclose()

    return create_app(service, settings.http, lifespan)
