"""A worker process's own small HTTP server: ``/metrics`` and the health
probes Kubernetes asks (``/v2/health/live``, ``/v2/health/ready``).

Readiness follows ``WorkerHealth``: not ready while models load, ready once
the worker consumes, not ready again from the moment it starts draining, so
a terminating pod leaves its Service while it answers what it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from enum import Enum

import uvicorn
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.metrics import metrics_route


class Phase(Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"


class WorkerHealth:
    def __init__(self) -> None:
        self.phase = Phase.STARTING

    def started(self) -> None:
        self.phase = Phase.READY

    def draining(self) -> None:
        self.phase = Phase.DRAINING

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY


def worker_http_app(health: WorkerHealth, registry: CollectorRegistry | None) -> Starlette:
    """Without a registry (``--no-metrics``) there is no ``/metrics``."""

    async def live(request: Request) -> Response:
        return Response(status_code=200)

    async def ready(request: Request) -> Response:
        return Response(health.phase.value, status_code=200 if health.ready else 503)

    routes = [Route("/v2/health/live", live, methods=["GET"]), Route("/v2/health/ready", ready, methods=["GET"])]
    if registry is not None:
        routes.append(metrics_route(registry))
    return Starlette(routes=routes)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The worker handles SIGTERM itself (to drain); uvicorn must not take it over.
        yield


class WorkerHttp:
    """Serves ``app`` on ``host:port`` inside the worker's event loop."""

    def __init__(self, app: Starlette, host: str, port: int) -> None:
        self._app = app
        self._host = host
        self._port = port
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        sock = _bind(self._host, self._port)
        config = uvicorn.Config(self._app, lifespan="off", access_log=False, log_level="warning", log_config=None)
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="worker-http")
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            await self._task  # surfaces why it could not start

    async def aclose(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        await asyncio.gather(self._task, return_exceptions=True)
        self._server = self._task = None


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"--metrics-port: cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.set_inheritable(True)
    return sock
