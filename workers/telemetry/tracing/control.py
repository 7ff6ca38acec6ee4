"""Which new traces are started: Triton's trace settings, for the whole process
and per model, changeable while it runs (``GET/POST /v2/trace/setting``).

``TraceControl`` decides for new traces (a span whose caller sent no
``traceparent``), through the sampler of ``workers.telemetry.tracing.sampler``;
a caller's sampled flag is followed whatever it says (the provider wraps that
sampler in ``ParentBased``). It imports no OpenTelemetry, so a process that
traces nothing can still answer the settings routes. Triton's settings map onto it:

- ``trace_level``: ``["OFF"]`` starts none, ``["TIMESTAMPS"]`` records spans
  (ferry's spans carry timestamps, never tensors: ``TENSORS`` is refused);
- ``trace_rate``: N, one new trace in every N;
- ``trace_count``: how many more traces to start, -1 for no limit.

A model's own settings override the process's, setting by setting; ``None``
for a setting drops the model's own. The model is the span's ``ferry.model``
attribute.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any


LEVELS = ("OFF", "TIMESTAMPS")
READ_ONLY = ("log_frequency", "trace_file", "trace_mode")
_INTEGER = re.compile(r"-?[0-9]+")
_FIELDS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count"}


class TraceSettingError(ValueError):
    """A trace setting that cannot be applied; the message names it."""


@dataclass(frozen=True, slots=True)
class _Scope:
    level: str | None = None
    rate: int | None = None
    count: int | None = None


class TraceControl:
    def __init__(self, enabled: bool, rate_share: float = 1.0, trace_file: str = "") -> None:
        """``enabled``: an exporter is configured; ``rate_share`` is ``--trace-rate`` (0 to 1),
        taken as one in round(1 / share)."""
        self.enabled = enabled
        self._file = trace_file
        level = "TIMESTAMPS" if enabled and rate_share > 0 else "OFF"
        rate = max(1, round(1 / rate_share)) if rate_share > 0 else 1
        self._global = _Scope(level, rate, -1)
        self._models: dict[str, _Scope] = {}
        self._seen: dict[str, int] = {}  # new traces considered, per scope ('' = the process's)
        self._lock = threading.Lock()

    # -- settings ------------------------------------------------------------

    def settings(self, model: str = "") -> dict[str, Any]:
        scope = self._effective(model)
        return {"trace_level": [scope.level], "trace_rate": str(scope.rate), "trace_count": str(scope.count),
                "log_frequency": "0", "trace_file": self._file, "trace_mode": "opentelemetry"}

    def update(self, changes: Mapping[str, Any], model: str = "") -> dict[str, Any]:
        """Apply ``changes`` (all checked first) to the process, or to ``model``; the settings after."""
        parsed = {_FIELDS.get(name, name): _parse(name, value, clearable=bool(model))
                  for name, value in changes.items()}
        if parsed.get("level") == "TIMESTAMPS" and not self.enabled:
            raise TraceSettingError("tracing is off in this process: start ferry with --trace-exporter "
                                    "to record traces")
        with self._lock:
            if model:
                own = self._models.get(model, _Scope())
                fields = {name: parsed[name] for name in ("level", "rate", "count") if name in parsed}
                own = replace(own, **fields)
                self._models[model] = own
                if own == _Scope():
                    del self._models[model]
            else:
                self._global = replace(self._global, **{k: v for k, v in parsed.items() if v is not None})
            self._seen.pop(model, None)
        return self.settings(model)

    def _effective(self, model: str) -> _Scope:
        own = self._models.get(model) if model else None
        if own is None:
            return self._global
        return _Scope(own.level or self._global.level,
                      own.rate if own.rate is not None else self._global.rate,
                      own.count if own.count is not None else self._global.count)

    # -- sampling ------------------------------------------------------------

    def take(self, model: str) -> bool:
        """Whether a new trace of ``model`` ('' when none) is started; counts it either way."""
        key = model if model in self._models else ""
        with self._lock:
            scope = self._effective(key)
            if scope.level != "TIMESTAMPS" or scope.count == 0:
                return False
            seen = self._seen.get(key, 0)
            self._seen[key] = seen + 1
            if seen % (scope.rate or 1):
                return False
            if scope.count is not None and scope.count > 0:
                self._count_down(key)
            return True

    def _count_down(self, key: str) -> None:
        own = self._models.get(key) if key else None
        if own is not None and own.count is not None:
            self._models[key] = replace(own, count=own.count - 1)
        else:
            self._global = replace(self._global, count=(self._global.count or 0) - 1)



def _parse(name: str, value: Any, clearable: bool) -> Any:
    if name in READ_ONLY:
        raise TraceSettingError(f"trace setting '{name}' cannot be changed while ferry runs")
    if value is None:
        if not clearable:
            raise TraceSettingError(f"trace setting '{name}' cannot be cleared for the whole server")
        return None
    if name == "trace_level":
        levels = value if isinstance(value, list) else [value]
        if not levels or not all(isinstance(level, str) for level in levels):
            raise TraceSettingError("trace setting 'trace_level' must be a list of levels")
        wanted = {level.upper() for level in levels}
        if "TENSORS" in wanted:
            raise TraceSettingError("trace level TENSORS is not supported: ferry's spans carry timestamps only")
        unknown = wanted - set(LEVELS)
        if unknown:
            raise TraceSettingError(f"unknown trace level '{sorted(unknown)[0]}' (levels: {', '.join(LEVELS)})")
        return "TIMESTAMPS" if "TIMESTAMPS" in wanted else "OFF"
    if name in ("trace_rate", "trace_count"):
        number = _integer(name, value)
        if name == "trace_rate" and number < 1:
            raise TraceSettingError("trace setting 'trace_rate' must be 1 or more (one trace in every N)")
        if name == "trace_count" and number < -1:
            raise TraceSettingError("trace setting 'trace_count' must be -1 (no limit) or more")
        return number
    raise TraceSettingError(f"unknown trace setting '{name}'")


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise TraceSettingError(f"trace setting '{name}' must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        return int(value)
    raise TraceSettingError(f"trace setting '{name}' must be an integer, got {value!r}")
