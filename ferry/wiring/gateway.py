"""``ferry gateway``: the HTTP gateway alone on a shared broker. It learns which
models are ready from the workers' heartbeats (``FleetReadiness``), and model
control travels on the broker's control channel to every worker."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.types import ASGIApp

from broker.transports import open_transport
from ferry.wiring.lifecycle import Closable, close_later, start_all
from ferry.wiring.gateway_side import GatewaySide, Sources
from ferry.wiring.readiness import FleetReadiness
from ferry.wiring.settings import ServeSettings
from ferry.wiring.stores import claim_store_url, live_workers, open_claims, open_heartbeats, open_jobs_store
from gateway.catalog import ModelCatalog
from workers.control.client import ControlClient
from workers.repository.layout import ModelRepository
from workers.telemetry.tracing import GATEWAY_SERVICE, open_tracing


@dataclass(frozen=True, slots=True)
class GatewayParts:
    """``ferry gateway``'s parts, built once; ``running`` starts and stops them (the HTTP
    app runs them in its lifespan, the in-process API with ``worker=False`` on its own)."""

    front: GatewaySide
    readiness: FleetReadiness
    closables: tuple[Closable | None, ...]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            close_later(stack, *self.closables)
            await start_all(stack, self.readiness)
            await self.front.start(stack)
            yield


def build_gateway_parts(settings: ServeSettings, readiness_refresh_s: float = 0.5) -> GatewayParts:
    transport = open_transport(settings.broker_url)
    prefix = settings.service.channel_prefix
    heartbeats = open_heartbeats(settings.broker_url, transport, settings.gateway_id, prefix)
    assert heartbeats is not None, "a gateway alone needs a shared broker"
    readiness = FleetReadiness(heartbeats, readiness_refresh_s)
    catalog = ModelCatalog(ModelRepository(settings.model_repository), readiness,
                           settings.management.control.expected_models)
    store = open_jobs_store(settings.broker_url, settings.job_store_url, settings.job_ttl_s, prefix)
    # The local id is never live here: a gateway alone waits on the fleet's heartbeats.
    control = ControlClient(transport, settings.gateway_id, live_workers(heartbeats, ""), prefix)
    tracing = open_tracing(settings.telemetry.trace, GATEWAY_SERVICE)
    claims = open_claims(claim_store_url(settings.broker_url, settings.claim_store_url, settings.job_store_url),
                         settings.claims, prefix)
    front = GatewaySide.build(settings, transport, catalog, store, control,
                              Sources(readiness.workers, heartbeats.beats), tracing, claims)
    return GatewayParts(front, readiness, (tracing, transport, heartbeats, claims))


def build_gateway_app(settings: ServeSettings, readiness_refresh_s: float = 0.5) -> ASGIApp:
    """The HTTP gateway alone; everything starts in its lifespan."""
    parts = build_gateway_parts(settings, readiness_refresh_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with parts.running():
            yield

    return parts.front.app(settings, lifespan)
