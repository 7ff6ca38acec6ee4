"""The OTLP/HTTP exporter against a collector stand-in: a real HTTP server on
loopback that decodes what it receives with OpenTelemetry's own protobufs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from workers.telemetry import Timeline
from workers.telemetry.settings import TraceSettings
from workers.telemetry.tracing import WORKER_SERVICE, open_tracing
from workers.telemetry.tracing.worker_spans import TracingObserver
from tests.tracing.spans import made_up_parent

T0 = 1_700_000_000_000_000_000


class Collector(ThreadingHTTPServer):
    def __init__(self) -> None:
        self.received: list[tuple[str, str, bytes]] = []  # (path, content type, body)
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"


class _Handler(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_spans_reach_an_otlp_collector_over_http_as_protobuf(collector: Collector) -> None:
    tracing = open_tracing(TraceSettings("otlp", endpoint=collector.url), WORKER_SERVICE)
    assert tracing is not None
    parent, trace_id, span_id = made_up_parent()
    timeline = Timeline("req-otlp", "add_sub", "1", "w1", trace={"traceparent": parent}, enqueued_ns=T0,
                        received_ns=T0 + 1000, compute_start_ns=T0 + 2000, compute_end_ns=T0 + 3000,
                        done_ns=T0 + 4000, batch_id="b-1", batch_size=1)
    TracingObserver(tracing).finished(timeline)
    asyncio.run(tracing.aclose())

    assert collector.received, "nothing reached the collector"
    path, content_type, _ = collector.received[0]
    assert path == "/v1/traces" and content_type == "application/x-protobuf"
    spans, services = {}, set()
    for _, _, body in collector.received:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            attributes = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
            services.add(attributes["service.name"])
            for scope in resource_spans.scope_spans:
                spans.update({span.name: span for span in scope.spans})
    assert services == {"ferry-worker"}
    assert sorted(spans) == ["ferry.batch_formation", "ferry.compute", "ferry.queue_wait", "ferry.worker.request"]
    request_span = spans["ferry.worker.request"]
    assert request_span.trace_id.hex() == trace_id and request_span.parent_span_id.hex() == span_id
    assert (request_span.start_time_unix_nano, request_span.end_time_unix_nano) == (T0, T0 + 4000)
    assert spans["ferry.compute"].parent_span_id == request_span.span_id
