"""What a worker asks of a model version it serves, and never which kind it is.

A ``Runner`` is a ``ModelRunner`` (``workers.runner``: backend instances and a
dynamic batcher) or an ``EnsembleRunner`` (``workers.ensemble.runner``). The
worker asks it for a response, or a decoupled model's responses as a stream.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from broker.envelope import Request, Response
from workers.errors import ExecutionError, WorkerError
from workers.repository.config import ModelConfig
from workers.repository.layout import ModelEntry
from workers.telemetry import Timeline

FINAL_FLAG = "triton_final_response"  # Triton's name for the flag on a decoupled model's responses


class Responder(Protocol):
    """What answers a request: ``respond`` raises a WorkerError on failure."""

    @property
    def entry(self) -> ModelEntry: ...

    @property
    def version(self) -> int: ...

    async def respond(self, request: Request, timeline: Timeline | None = None) -> Response: ...

    def respond_stream(self, request: Request) -> AsyncIterator[Response]:
        """A decoupled model's responses, each tagged ``FINAL_FLAG`` False."""
        ...


class Runner(Responder, Protocol):
    """A model version as a worker serves it: sized, started and closed."""

    @property
    def config(self) -> ModelConfig: ...

    @property
    def capacity(self) -> int: ...

    @property
    def priority_levels(self) -> int: ...

    @property
    def retries_failures(self) -> bool:
        """Whether a failed request may be released for another try."""
        ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Clocks:
    monotonic: Callable[[], float] = time.monotonic
    wall_ns: Callable[[], int] = time.time_ns


def error_of(exc: BaseException) -> WorkerError:
    """Any failure as a WorkerError whose code can travel on the wire."""
    if isinstance(exc, WorkerError):
        return exc
    return ExecutionError(f"{type(exc).__name__}: {exc}")
