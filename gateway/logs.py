"""structlog set-up for ferry's processes: JSON lines when not on a terminal.

Libraries that log through the standard library (kafka-python, uvicorn,
asyncio, warnings) go through the same renderer, so every line a process
writes has one format. Their level is at least WARNING: they describe every
connection at INFO, which says nothing about requests.
"""

from __future__ import annotations

import logging
import sys

import structlog
from structlog.typing import Processor

STDLIB_FLOOR = logging.WARNING


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    json_lines = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer = structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer()
    numeric = logging.getLevelName(level.upper())
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    route_stdlib(shared, renderer, max(numeric, STDLIB_FLOOR))


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
