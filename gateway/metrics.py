"""The gateway's ``/metrics``: its own view of HTTP inference requests, the
live workers, the queue backlog, and (in ``ferry serve``) the local worker's
``StatsBook``, all rendered from plain numbers at scrape time into a registry
this process owns.

``HttpCounting`` is ASGI middleware: it counts each inference request (infer,
infer_stream, generate, generate_stream) by model and status code, and times
it until the app has sent its last byte (``gateway.infer_lane`` counts the infer
requests it answers the same way). A model name the catalog does not
know is counted as ``_unknown``, so clients cannot mint label values.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker import channels
from gateway.backlog import Backlog, BacklogCollector, BacklogPoller, index_models
from gateway.catalog import ModelCatalog
from workers.telemetry.histogram import DURATION_BOUNDS, Histogram
from workers.telemetry.prometheus import StatsCollector, histogram_family
from workers.telemetry.settings import TelemetrySettings
from workers.telemetry.stats import StatsBook

UNKNOWN_MODEL = "_unknown"
_INFERENCE_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/(?:infer|infer_stream|generate|generate_stream)$")

LiveWorkers = Callable[[], Iterable[str]]


class HttpBook:
    """Cumulative counts and durations of the gateway's inference requests."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()  # (model, status code)
        self.durations: dict[str, Histogram] = {}

    def record(self, model: str, code: int, seconds: float) -> None:
        self.requests[(model, str(code))] += 1
        histogram = self.durations.get(model)
        if histogram is None:
            histogram = self.durations[model] = Histogram(DURATION_BOUNDS)
        histogram.observe(seconds)


Record = Callable[[str, int, float], None]  # model, status code, seconds


class HttpCounting:
    def __init__(self, app: ASGIApp, record: Record, clock: Callable[[], float] = time.perf_counter) -> None:
        self._app = app
        self._record = record
        self._clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = _INFERENCE_PATH.match(scope["path"]) if scope["type"] == "http" else None
        if match is None:
            await self._app(scope, receive, send)
            return
        started, status = self._clock(), 500  # an app that raises before answering is a 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self._app(scope, receive, sending)
        finally:
            self._record(match.group(1), status, self._clock() - started)


class HttpCollector(Collector):
    def __init__(self, book: HttpBook) -> None:
        self._book = book

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("ferry_http_requests", "Inference requests the gateway answered, by status code.",
                                       labels=["model", "code"])
        for (model, code), count in sorted(self._book.requests.items()):
            requests.add_metric([model, code], count)
        yield requests
        yield histogram_family("ferry_http_request_duration_seconds",
                               "Time the gateway took to answer an inference request.", ["model"],
                               [([model], histogram) for model, histogram in sorted(self._book.durations.items())])


class LivenessCollector(Collector):
    """``ferry_worker_up`` per live worker and ``ferry_workers_live``, from heartbeats."""

    def __init__(self, workers: LiveWorkers) -> None:
        self._workers = workers

    def collect(self) -> Iterator[Metric]:
        live = sorted(self._workers())
        up = GaugeMetricFamily("ferry_worker_up", "1 for each worker whose heartbeat is current.", labels=["worker"])
        for worker in live:
            up.add_metric([worker], 1)
        yield up
        yield GaugeMetricFamily("ferry_workers_live", "Workers whose heartbeat is current.", value=len(live))


class LostCollector(Collector):
    """``ferry_lost_requests_total``: requests (``kind="request"``) and async jobs (``kind="job"``)
    the broker lost in a failure, by model and what became of them (``broker.lost_requests``)."""

    def __init__(self, requests: Counter[tuple[str, str]], jobs: Counter[tuple[str, str]]) -> None:
        self._books = {"request": requests, "job": jobs}

    def collect(self) -> Iterator[Metric]:
        lost = CounterMetricFamily("ferry_lost_requests", "Requests the broker lost in a failure, "
                                   "sent again (sent_again) or answered with an error (failed).",
                                   labels=["model", "kind", "outcome"])
        for kind, book in self._books.items():
            for (model, outcome), count in sorted(book.items()):
                lost.add_metric([model, kind, outcome], count)
        yield lost


class GatewayMetrics:
    """The registry behind a gateway's ``/metrics``, with the middleware and
    background poller that feed it."""

    def __init__(self, known: Callable[[str], bool], backlog: BacklogPoller) -> None:
        self.registry = CollectorRegistry()
        self.http = HttpBook()
        self.backlog = backlog
        self._known = known
        self.registry.register(HttpCollector(self.http))
        self.registry.register(BacklogCollector(backlog))

    def register(self, collector: Collector) -> None:
        self.registry.register(collector)

    def routes(self) -> list[Route]:
        return [metrics_route(self.registry)]

    def middleware(self) -> list[Middleware]:
        return [Middleware(HttpCounting, record=self.record)]

    def record(self, model: str, code: int, seconds: float) -> None:
        """One inference request answered; a model the catalog does not know counts as ``_unknown``."""
        self.http.record(model if self._known(model) else UNKNOWN_MODEL, code, seconds)

    async def start(self) -> None:
        await self.backlog.start()

    async def aclose(self) -> None:
        await self.backlog.aclose()


def metrics_route(registry: CollectorRegistry) -> Route:
    """``GET /metrics``: ``registry`` in Prometheus' text format."""

    async def scrape(request: Request) -> Response:
        # Rendered on the event loop, the thread that updates the books, so a scrape sees whole numbers.
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Route("/metrics", scrape, methods=["GET"])


def gateway_metrics(settings: TelemetrySettings, broker: Backlog, catalog: ModelCatalog, workers: LiveWorkers,
                    lost: LostCollector, prefix: str = channels.PREFIX, stats: StatsBook | None = None,
                    worker_id: str = "") -> GatewayMetrics | None:
    """The gateway's metrics, or None with ``--no-metrics``; ``lost`` is what the broker lost,
    ``stats`` the local worker's book (``ferry serve``)."""
    if not settings.metrics:
        return None
    poller = BacklogPoller(broker, lambda: index_models(catalog.index), prefix, settings.backlog_interval_s)
    metrics = GatewayMetrics(lambda name: name in catalog.index.entries, poller)
    metrics.register(LivenessCollector(workers))
    metrics.register(lost)
    if stats is not None:
        metrics.register(StatsCollector(stats, worker_id))
    return metrics
