"""``ferry worker``: a worker alone on a shared broker. It heartbeats, serves until
SIGTERM or SIGINT, then leaves the fleet and drains: what it took is answered
and acked before it exits. SIGUSR2 logs what its tasks wait on (``task_dump``)."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import structlog
from prometheus_client import CollectorRegistry

from broker.transports import open_transport
from ferry.wiring.lifecycle import close_later, start_all
from ferry.wiring.settings import WorkerProcessSettings
from ferry.wiring.task_dump import install_task_dump
from ferry.wiring.stores import (
    claim_store_url, open_cache, open_claims, open_heartbeats, open_job_gate, open_sessions,
)
from ferry.wiring.worker_http import WorkerHealth, WorkerHttp, worker_http_app
from ferry.wiring.worker_side import WorkerSide
from workers.repository.layout import ModelRepository
from workers.telemetry.prometheus import StatsCollector
from workers.telemetry.settings import TelemetrySettings
from workers.telemetry.stats import StatsBook
from workers.telemetry.tracing import WORKER_SERVICE, open_tracing

log = structlog.get_logger("ferry.fleet")


async def run_worker(settings: WorkerProcessSettings) -> None:
    """Serve until SIGTERM/SIGINT, then finish and ack what is in flight."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    install_task_dump(loop)
    health = WorkerHealth()
    async with contextlib.AsyncExitStack() as stack:
        worker_id = await _serve(settings, health, stack)
        await stop.wait()
        health.draining()
        # The stack now leaves the fleet first (the heartbeat stops, so gateways stop
        # counting on this worker), then drains, then closes.
        log.info("worker.stopping", worker_id=worker_id)
    log.info("worker.stopped", worker_id=worker_id)


async def _serve(settings: WorkerProcessSettings, health: WorkerHealth, stack: contextlib.AsyncExitStack) -> str:
    tracing = open_tracing(settings.telemetry.trace, WORKER_SERVICE)
    transport = open_transport(settings.broker_url)
    prefix, worker_id = settings.worker.channel_prefix, settings.worker.worker_id
    heartbeats = open_heartbeats(settings.broker_url, transport, worker_id, prefix)
    assert heartbeats is not None, "a worker alone needs a shared broker"
    job_gate = open_job_gate(settings.broker_url, settings.job_store_url, prefix)
    sessions = open_sessions(settings.broker_url, worker_id, heartbeats, settings.session_store_url, prefix)
    claims = open_claims(claim_store_url(settings.broker_url, settings.claim_store_url, settings.job_store_url),
                         settings.claims, prefix)
    cache = open_cache(settings.cache, prefix)
    close_later(stack, tracing, transport, heartbeats, job_gate, sessions, claims, cache)
    back = WorkerSide.build(transport, ModelRepository(settings.model_repository), settings.worker,
                            settings.telemetry, tracing, job_gate, sessions, claims, cache)
    http = _worker_http(settings.telemetry, health, back.stats, worker_id)
    await start_all(stack, http)  # liveness answers while models load
    await back.start(stack)
    heartbeat = back.heartbeat(heartbeats, settings.heartbeat)
    await start_all(stack, heartbeat)
    health.started()
    log.info("worker.started", worker_id=worker_id, models=back.worker.ready_models())
    return worker_id


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
