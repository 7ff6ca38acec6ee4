"""structlog set-up for ferry's processes: JSON lines when not on a terminal.

Libraries that log through the standard library (kafka-python, uvicorn,
asyncio, warnings) go through the same renderer, so every line a process
writes has one format. Their level is at least WARNING: they describe every
connection at INFO, which says nothing about requests.

What is written can change while the process runs (Triton's logging
extension, ``GET/POST /v2/logging``): ``LogControl`` holds the levels and the
format, and the processors read it on every line. Logging is the process's,
so there is one ``LogControl`` per process, ``PROCESS_LOGS``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from gateway.errors import InvalidRequest

STDLIB_FLOOR = logging.WARNING
FORMATS = ("json", "console")
_SETTABLE = ("log_info", "log_warning", "log_error", "log_verbose_level", "log_format")


class LogControl:
    """Which levels are written (Triton's ``log_info``, ``log_warning``, ``log_error`` and
    ``log_verbose_level``: above 0, debug lines too) and as what (``json`` or ``console``)."""

    def __init__(self, level: str = "info", fmt: str = "json") -> None:
        numeric = logging.getLevelName(level.upper())
        if not isinstance(numeric, int):
            raise ValueError(f"unknown log level '{level}'")
        self.verbose = 1 if numeric <= logging.DEBUG else 0
        self.info = numeric <= logging.INFO
        self.warning = numeric <= logging.WARNING
        self.error = numeric <= logging.ERROR
        self.format = fmt
        self._json = structlog.processors.JSONRenderer()
        self._console = structlog.dev.ConsoleRenderer()

    def gate(self, logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
        """The first processor: a line of a level switched off goes no further."""
        if not self._writes(method):
            raise structlog.DropEvent
        return event

    def render(self, logger: WrappedLogger, method: str, event: EventDict) -> str | bytes:
        return (self._json if self.format == "json" else self._console)(logger, method, event)

    def settings(self) -> dict[str, Any]:
        return {"log_file": "", "log_info": self.info, "log_warning": self.warning, "log_error": self.error,
                "log_verbose_level": self.verbose, "log_format": self.format}

    def update(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` (all checked before any is applied); the settings after."""
        for name, value in changes.items():
            _check(name, value)
        self.info = changes.get("log_info", self.info)
        self.warning = changes.get("log_warning", self.warning)
        self.error = changes.get("log_error", self.error)
        self.verbose = changes.get("log_verbose_level", self.verbose)
        self.format = changes.get("log_format", self.format)
        logging.getLogger().setLevel(self.stdlib_level())
        return self.settings()

    def stdlib_level(self) -> int:
        if self.warning:
            return STDLIB_FLOOR
        return logging.ERROR if self.error else logging.CRITICAL + 1

    def _writes(self, method: str) -> bool:
        if method == "debug":
            return self.verbose > 0
        if method == "info":
            return self.info
        if method in ("warning", "warn"):
            return self.warning
        return self.error  # error, exception, critical


def _check(name: str, value: Any) -> None:
    if name == "log_file":
        raise InvalidRequest("log setting 'log_file' cannot be changed while ferry runs: its logs go to stderr")
    if name not in _SETTABLE:
        raise InvalidRequest(f"unknown log setting '{name}' (settable: {', '.join(_SETTABLE)})")
    if name == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidRequest("log setting 'log_verbose_level' must be an integer of 0 or more")
    elif name == "log_format":
        if value not in FORMATS:
            raise InvalidRequest(f"log setting 'log_format' must be one of {', '.join(FORMATS)}, got {value!r}")
    elif not isinstance(value, bool):
        raise InvalidRequest(f"log setting '{name}' must be true or false")


PROCESS_LOGS = LogControl()


def configure_logging(level: str = "info", fmt: str = "auto", control: LogControl = PROCESS_LOGS) -> None:
    json_lines = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    control.update({"log_format": "json" if json_lines else "console"})
    initial = LogControl(level)
    control.update({"log_info": initial.info, "log_warning": initial.warning, "log_error": initial.error,
                    "log_verbose_level": initial.verbose})
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[control.gate, *shared, structlog.processors.format_exc_info, control.render],
        # Every level reaches the gate, which may be told to let debug lines through later.
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    route_stdlib(shared, control.render, control.stdlib_level())


def route_stdlib(shared: list[Processor], renderer: Processor, level: int) -> None:
    """Send the standard library's records (every logger's) through ``renderer``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)
