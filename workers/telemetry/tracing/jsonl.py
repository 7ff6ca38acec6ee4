"""A span exporter writing one JSON object per span per line, for files a
test or a person can read without a collector.

    {"name": "ferry.compute", "trace_id": "<32 hex>", "span_id": "<16 hex>",
     "parent_id": "<16 hex>" | null, "start_ns": 1, "end_ns": 2,
     "attributes": {...}, "service": "ferry-worker", "status": "unset" | "ok" | "error"}
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class JsonlSpanExporter(SpanExporter):
    def __init__(self, path: Path) -> None:
        try:
            self._file = open(path, "a", encoding="utf-8")  # appended: several runs may share one file
        except OSError as exc:
            raise ValueError(f"cannot open trace file {path}: {exc.strerror}") from None
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(span), default=str) + "\n" for span in spans)
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            try:
                self._file.write(lines)
                self._file.flush()
            except OSError:
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # every export is flushed as it is written

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()


def span_record(span: ReadableSpan) -> dict[str, Any]:
    context, parent = span.get_span_context(), span.parent
    assert context is not None, "a span the SDK ended always carries its context"
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": dict(span.attributes or {}),
        "service": span.resource.attributes.get("service.name", ""),
        "status": span.status.status_code.name.lower(),
    }
