"""The live dashboard: ``GET /dashboard`` (one static page) and ``GET /dashboard/data`` (JSON).

The page polls the data every ``interval_s`` and draws it itself; nothing is
fetched from anywhere else, and its Content-Security-Policy says so. The data
joins what the gateway already knows: the catalog (models, versions,
readiness), the sampler (live workers, throughput, latency, batch sizes) and
the backlog poller (queue lag and pending).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from gateway.backlog import QueueBacklog
from gateway.catalog import ModelCatalog
from gateway.dashboard_data import ModelWindow, pending
from gateway.dashboard_sampler import DashboardSettings, Point, StatsSampler, WorkerBeats
from gateway.metrics import GatewayMetrics
from workers.heartbeat import Beat, ServedModels
from workers.telemetry.wire import WorkerStats

PAGE = "static/dashboard.html"
# Inline script and style only, data from this origin only: the page works without internet.
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
       "connect-src 'self'; img-src 'self' data:")
SERIES = ("requests_per_s", "inferences_per_s", "p50_ms", "p99_ms")

Queues = Callable[[], Sequence[QueueBacklog]]


class Dashboard:
    def __init__(self, catalog: ModelCatalog, sampler: StatsSampler, queues: Queues = list,
                 clock: Callable[[], float] = time.time) -> None:
        self._catalog = catalog
        self._sampler = sampler
        self._queues = queues
        self._clock = clock
        self._page = resources.files("gateway").joinpath(PAGE).read_text(encoding="utf-8")

    async def start(self) -> None:
        await self._sampler.start()

    async def aclose(self) -> None:
        await self._sampler.aclose()

    def routes(self) -> list[Route]:
        return [Route("/dashboard", self.page, methods=["GET"]),
                Route("/dashboard/data", self.data_route, methods=["GET"])]

    async def page(self, request: Request) -> Response:
        return HTMLResponse(self._page, headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"})

    async def data_route(self, request: Request) -> Response:
        return Response(orjson.dumps(self.data()), media_type="application/json",
                        headers={"Cache-Control": "no-store"})

    def data(self) -> dict[str, Any]:
        settings = self._sampler.settings
        names = self._catalog.names()
        points = self._sampler.points()
        latest = self._sampler.latest()
        return {
            "generated_at_ms": round(self._clock() * 1000),
            "settings": {"interval_s": settings.interval_s, "rate_window_s": settings.rate_window_s,
                         "summary_window_s": settings.summary_window_s, "history_s": settings.history_s},
            "models": self._models(names),
            "workers": self._workers(),
            "queues": [row.to_json() for row in self._queues()],
            "pending": pending(latest) if latest is not None else {},
            "now": _windows(points[-1].models if points else {}, names),
            "summary": _windows(self._sampler.summary(), names),
            "series": _series(points, names),
        }

    def _workers(self) -> list[dict[str, Any]]:
        rates = self._sampler.by_worker()
        now = self._clock()
        return [_worker(beat, rates.get(worker, {}), now) for worker, beat in sorted(self._sampler.beats().items())]

    def _models(self, names: list[str]) -> list[dict[str, Any]]:
        # The catalog's repository-index rows say why a model is unavailable.
        reasons = {row["name"]: row["reason"] for row in reversed(self._catalog.states()) if row["reason"]}
        rows = []
        for name in names:
            entry = self._catalog.index.entries.get(name)
            ready = self._catalog.ready_versions(name)
            rows.append({"name": name, "versions": list(entry.versions) if entry else [],
                         "ready_versions": list(ready), "ready": bool(ready),
                         "reason": "" if ready else reasons.get(name, "")})
        return rows


def build_dashboard(catalog: ModelCatalog, workers: WorkerBeats, metrics: GatewayMetrics | None,
                    settings: DashboardSettings = DashboardSettings()) -> Dashboard:
    """The queue panel reads the metrics' backlog poller; with ``--no-metrics`` it stays empty."""
    queues: Queues = metrics.backlog.snapshot if metrics is not None else list
    return Dashboard(catalog, StatsSampler(workers, settings), queues)


def local_beats(worker_id: str, served: Callable[[], ServedModels],
                stats: Callable[[], WorkerStats] | None) -> WorkerBeats:
    """The one worker of ``ferry serve`` on the in-memory broker, read in process."""

    async def beats() -> Mapping[str, Beat]:
        return {worker_id: Beat(worker_id, served(), stats() if stats else None, time.time_ns())}

    return beats


def _worker(beat: Beat, rates: Mapping[str, ModelWindow], now_s: float) -> dict[str, Any]:
    """A live worker; its rates over the last rate window (None when its heartbeat has no stats)."""
    known = beat.stats is not None
    return {"id": beat.worker, "models": {name: list(versions) for name, versions in sorted(beat.models.items())},
            "stats": known, "age_s": max(0.0, now_s - beat.sent_ns / 1e9) if beat.sent_ns else None,
            "inferences_per_s": sum(w.inferences_per_s for w in rates.values()) if known else None,
            "requests_per_s": sum(w.requests_per_s for w in rates.values()) if known else None}


def _windows(windows: Mapping[str, ModelWindow], names: list[str]) -> dict[str, Any]:
    return {model: windows.get(model, ModelWindow()).to_json() for model in sorted({*names, *windows})}


def _series(points: list[Point], names: list[str]) -> dict[str, Any]:
    models = sorted({*names, *(model for point in points for model in point.models)})
    out: dict[str, dict[str, list[float | None]]] = {model: {key: [] for key in SERIES} for model in models}
    for point in points:
        for model in models:
            values = point.models.get(model, ModelWindow()).to_json()
            for key in SERIES:
                out[model][key].append(values[key])
    return {"t_ms": [round(point.at_s * 1000) for point in points], "models": out}
