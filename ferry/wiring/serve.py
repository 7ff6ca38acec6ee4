"""``ferry serve``: gateway, worker and broker in one process and one event loop.

On a shared broker (``redis://`` or ``kafka://``) the worker also heartbeats, so gateways
started elsewhere with ``ferry gateway`` count it as serving its models.

Model control (``ServeSettings.management``) goes through the broker's control
channel even in one process, so ``ferry serve`` loads and unloads exactly as a
fleet does.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.types import ASGIApp

from broker.transport import Transport
from broker.transports import open_transport
from ferry.wiring.lifecycle import Closable, close_later, start_all
from ferry.wiring.gateway_side import GatewaySide, Sources
from ferry.wiring.settings import ServeSettings
from ferry.wiring.stores import (
    claim_store_url, live_workers, open_cache, open_claims, open_heartbeats, open_jobs_store,
)
from ferry.wiring.worker_side import WorkerSide
from gateway.catalog import ModelCatalog
from gateway.dashboard import local_beats
from workers.control.client import ControlClient
from workers.heartbeat import Heartbeat
from workers.repository.layout import ModelRepository
from workers.telemetry.tracing import SERVE_SERVICE, open_tracing


@dataclass(frozen=True, slots=True)
class Serving:
    """``ferry serve``'s parts, built once: the gateway side, the worker side, and what
    they share. ``running`` starts them all and stops them again; the HTTP app and the
    in-process API (``ferry.api``) both run them that way."""

    front: GatewaySide
    back: WorkerSide
    catalog: ModelCatalog
    heartbeat: Heartbeat | None
    closables: tuple[Closable | None, ...]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            close_later(stack, *self.closables)
            # The worker first: the dashboard's first sample and the metrics see its models loaded.
            # On the in-memory broker nothing outlives the process: no drain.
            await self.back.start(stack, self.catalog.index, drain=self.heartbeat is not None)
            await self.front.start(stack)
            await start_all(stack, self.heartbeat)
            yield


def build_serving(settings: ServeSettings, transport: Transport | None = None) -> Serving:
    transport = transport or open_transport(settings.broker_url)
    prefix = settings.service.channel_prefix
    repository = ModelRepository(settings.model_repository)
    store = open_jobs_store(settings.broker_url, settings.job_store_url, settings.job_ttl_s, prefix)
    tracing = open_tracing(settings.telemetry.trace, SERVE_SERVICE)
    claims = open_claims(claim_store_url(settings.broker_url, settings.claim_store_url, settings.job_store_url),
                         settings.claims, prefix)
    cache = open_cache(settings.cache, prefix)
    back = WorkerSide.build(transport, repository, settings.worker, settings.telemetry, tracing, job_gate=store,
                            claims=claims, cache=cache)
    worker, stats = back.worker, back.stats
    heartbeats = open_heartbeats(settings.broker_url, transport, worker.worker_id, prefix)
    heartbeat = None if heartbeats is None else back.heartbeat(heartbeats, settings.heartbeat)
    catalog = ModelCatalog(repository, worker.ready_models, settings.management.control.expected_models)
    control = ControlClient(transport, settings.gateway_id, live_workers(heartbeats, worker.worker_id), prefix)
    beats = heartbeats.beats if heartbeats else local_beats(worker.worker_id, worker.ready_models,
                                                             stats.to_wire if stats else None)
    # The local worker is live while this process is; workers elsewhere have their own /metrics.
    sources = Sources(lambda: (worker.worker_id,), beats, stats, worker.worker_id)
    # On the embedded broker the worker is the only one: requests need not cross the broker to reach it.
    # With --worker-per-http each HTTP process has a worker of its own, which answers its plain requests.
    shared = heartbeats is not None
    local = worker if settings.service.direct and (not shared or settings.service.direct_on_shared_broker) else None
    front = GatewaySide.build(settings, transport, catalog, store, control, sources, tracing, claims, local)
    return Serving(front, back, catalog, heartbeat, (tracing, transport, heartbeats, claims, cache))


def build_app(settings: ServeSettings, transport: Transport | None = None) -> ASGIApp:
    """The whole stack as an ASGI app; everything starts in its lifespan."""
    serving = build_serving(settings, transport)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with serving.running():
            yield

    return serving.front.app(settings, lifespan)
