"""The HTTP server under the gateway: uvicorn, guarded against clients that
hold a connection without finishing a request.

uvicorn has no timeout for reading a request's headers or body, and no cap on
connections (``limit_concurrency`` answers 503 only once headers are in, so
silent connections still pile up). ``GuardedHttpTools`` adds the three to
uvicorn's httptools protocol:

- header timeout: from when a request may begin (the connection is made, or
  its first byte arrives after a keep-alive wait) until its headers are
  complete. A partial request gets 408; a silent connection is just closed.
- body timeout: the longest wait for the next chunk of an unfinished body,
  not counted while the app itself is behind. Then 408, and the app sees the
  client disconnect.
- header size: a request line and headers over ``max_header_bytes`` get 400
  (uvicorn's answer to any request it cannot parse), since within the header
  timeout a fast client could otherwise send gigabytes of headers.
- connection limit: a connection over it gets 503 and is closed at once.

An idle keep-alive connection is closed by uvicorn's own keep-alive timeout.

Each request's response goes out in one write where it can (``gateway.held_head``).
An infer request to an app that carries a lane is answered on it, past ASGI
(``gateway.infer_lane``).
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from collections.abc import Callable
from typing import Any

import structlog
import uvicorn
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from gateway.held_head import HeldHead
from gateway.infer_lane import InferLane, LaneBody, lane_of
from gateway.v2_codec import render_error

log = structlog.get_logger("ferry.gateway.http")


class ConnectionLimits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(30.0, gt=0)
    max_connections: int = Field(4096, ge=1)
    max_header_bytes: int = Field(64 * 1024, ge=1024)


def serve(app: ASGIApp, host: str, port: int, limits: ConnectionLimits, reuse_port: bool = False,
          extra_ports: tuple[int, ...] = ()) -> None:
    """Serve ``app`` until SIGTERM or SIGINT, on ``port`` and ``extra_ports`` (a
    platform contract's; the app tells them apart by the port in its scope). With
    ``reuse_port``, other processes listening on the same ports with it share the
    connections (``SO_REUSEPORT``: the kernel spreads new connections over the
    listeners, and when one dies the others take its share)."""
    config = uvicorn.Config(
        app, host=host, port=port, loop="uvloop", lifespan="on", access_log=False, log_level="warning",
        # uvicorn calls it with its own arguments, as it would the class.
        http=functools.partial(GuardedHttpTools, limits=limits, refusals=Refusals(),  # type: ignore[arg-type]
                               lane=lane_of(app)),
        log_config=None,  # its records reach the root handler configure_logging set: JSON like ours
    )
    sockets = None
    if reuse_port or extra_ports:
        sockets = []
        for each in (port, *extra_ports):
            try:
                sockets.append(port_socket(host, each, reuse_port))
            except OSError as exc:
                for sock in sockets:
                    sock.close()
                raise SystemExit(f"ferry: cannot listen on {host}:{each}: {exc.strerror or exc}") from None
    uvicorn.Server(config).run(sockets=sockets)


def shared_port_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT``; ``listen`` is left to its server."""
    return port_socket(host, port, reuse_port=True)


def port_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    """A socket bound to ``host:port`` (``SO_REUSEPORT`` if asked); ``listen`` is left to its server."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


class HeadersTooLarge(Exception):
    pass


class Refusals:
    """Counts connections refused over the limit, to log them once a second
    rather than once each while a flood lasts."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, every_s: float = 1.0) -> None:
        self._clock = clock
        self._every_s = every_s
        self._unlogged = 0
        self._logged_at = -every_s

    def refused(self, limit: int) -> None:
        self._unlogged += 1
        now = self._clock()
        if now - self._logged_at >= self._every_s:
            log.warning("http.connections_refused", refused=self._unlogged, limit=limit)
            self._unlogged, self._logged_at = 0, now


class GuardedHttpTools(HttpToolsProtocol):
    def __init__(self, *args: Any, limits: ConnectionLimits, refusals: Refusals, lane: InferLane | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._refusals = refusals
        self._lane = lane
        self._lane_body: LaneBody | None = None  # the body of the request last started on the lane
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._request_begun = False
        self._header_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self._limits.max_connections:
            self._refusals.refused(self._limits.max_connections)
            self._answer_and_close(503, f"over the limit of {self._limits.max_connections} connections")
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        self._wake_lane()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._request_begun = True
        self._header_bytes = 0
        if self._header_timer is None:  # after a keep-alive wait; else it runs on from connection_made
            self._arm_header_timer()

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._request_begun = False
        super().on_headers_complete()
        self._arm_body_timer()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        """Start a request's cycle (at once, or after those pipelined before it): on the lane
        if it takes it, else through ASGI with one write per response."""
        params = self._lane.accepts(cycle.scope) if self._lane is not None and app is self.app else None
        if params is None:
            cycle.transport = HeldHead(self.transport, self.loop)  # type: ignore[assignment]
            super()._start_asgi_task(cycle, app)
            return
        assert self._lane is not None
        self._lane_body = body = LaneBody(cycle, self.loop)
        task = self.loop.create_task(self._lane.serve(body, params))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def on_body(self, body: bytes) -> None:
        lane_body = self._lane_body
        if lane_body is not None and lane_body.cycle is self.cycle:
            lane_body.add(body, self.flow)
        else:
            super().on_body(body)
        self._arm_body_timer()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()
        self._wake_lane()

    def _wake_lane(self) -> None:
        """Tell a lane request reading its body that something happened, as uvicorn sets its
        cycle's event (``gateway.infer_lane.LaneBody``)."""
        if self._lane_body is not None:
            self._lane_body.wake()

    def handle_websocket_upgrade(self) -> None:
        self._disarm()  # the connection is the WebSocket protocol's from here
        super().handle_websocket_upgrade()

    def _count_header_bytes(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self._limits.max_header_bytes:
            log.info("http.headers_too_large", client=self.client, limit=self._limits.max_header_bytes)
            # Raised in a parser callback, it stops the parser; uvicorn answers 400 and closes.
            raise HeadersTooLarge(f"request headers exceed {self._limits.max_header_bytes} bytes")

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self._limits.header_timeout_s, self._header_timed_out)

    def _arm_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
        self._body_timer = self.loop.call_later(self._limits.body_timeout_s, self._body_timed_out)

    def _disarm(self) -> None:
        for timer in (self._header_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if not self._request_begun:
            log.debug("http.idle_connection_closed", client=self.client)
            self.transport.close()
            return
        log.info("http.header_timeout", client=self.client, timeout_s=self._limits.header_timeout_s)
        idle = self.cycle is None or self.cycle.response_complete  # else a pipelined answer is on its way
        self._answer_and_close(408, f"request headers not received within {self._limits.header_timeout_s:g} s",
                               answer=idle)

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.flow.read_paused:  # the app has not read what it was sent: it is behind, not the client
            self._arm_body_timer()
            return
        log.info("http.body_timeout", client=self.client, timeout_s=self._limits.body_timeout_s,
                 path=self.scope.get("path"))
        answer = not self.cycle.response_started
        self.cycle.disconnected = True  # the app reads a disconnect, and anything it sends goes nowhere
        self.cycle.message_event.set()
        self._wake_lane()
        self._answer_and_close(408, f"request body stalled for {self._limits.body_timeout_s:g} s", answer)

    def _answer_and_close(self, status: int, message: str, answer: bool = True) -> None:
        if answer:
            body = render_error(message)
            self.transport.write(b"".join((
                STATUS_LINE[status], b"content-type: application/json\r\n",
                b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body,
            )))
        self.transport.close()
