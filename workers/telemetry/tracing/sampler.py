"""The OpenTelemetry sampler that asks ``TraceControl`` about each new trace."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, TraceState
from opentelemetry.util.types import Attributes

from workers.telemetry.tracing import names
from workers.telemetry.tracing.control import TraceControl


class ControlledSampler(Sampler):
    def __init__(self, control: TraceControl) -> None:
        self._control = control

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None, trace_state: TraceState | None = None) -> SamplingResult:
        model = str(attributes.get(names.MODEL, "")) if attributes else ""
        if self._control.take(model):
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, trace_state)
        return SamplingResult(Decision.DROP, None, trace_state)

    def get_description(self) -> str:
        return "ferry.ControlledSampler"
