"""The infer lane: ``POST /v2/models/{model}[/versions/{version}]/infer`` answered by the
HTTP protocol itself, past ASGI.

Through ASGI an infer request crosses uvicorn's app wrappers, Starlette and its
middleware, is read as ``http.request`` messages into a ``Request``, and answered
as a ``Response`` sent as two messages, each checked and passed down the same
wrappers (together some 25 µs of a small request on the 2-core development
machine; ``benchmarks/README.md``). On the lane the protocol
(``gateway.http_server``) hands the request's uvicorn cycle to the app's infer
handler, which reads the body as the protocol collects it (``LaneBody``) and
returns its whole answer (``Rendered``); the lane writes it in one system call and
ends the cycle as uvicorn's own ``send`` would, so keep-alive, pipelining, flow
control, ``Expect: 100-continue`` and the body timeout work as before. The request
is counted in ``/metrics`` as ``gateway.metrics.HttpCounting`` counts it.

Only the main app's infer route takes the lane, and only where the app would route
it there (no root path, not on a platform contract's port); every other request,
and every request of an app that carries no lane, goes through ASGI as before.
The same handler answers the infer route through ASGI (``gateway.app``), so both
ways give the same answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Mapping
from time import perf_counter
from typing import Any, Protocol

import structlog
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Scope
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from gateway.infer_door import match_infer
from gateway.platforms.ports import PortDispatch
from gateway.responses import Rendered

log = structlog.get_logger("ferry.gateway.http")

_JOINED = 16 * 1024  # a body up to this size is copied behind its head, one buffer being cheaper to send


class LaneHeaders(Mapping[str, str]):
    """A lane request's headers, looked up by name in any case: the first of each name, as
    Starlette's ``Headers`` gives it, from a dict built once (``Headers`` scans its list on
    every lookup)."""

    __slots__ = ("_raw", "_first")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:  # names in lower case, as uvicorn gives them
        self._raw = raw
        self._first = {name.decode("latin-1"): value.decode("latin-1") for name, value in reversed(raw)}

    def __getitem__(self, key: str) -> str:
        return self._first[key.lower()]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.lower() in self._first

    def __iter__(self) -> Iterator[str]:
        return iter(self._first)

    def __len__(self) -> int:
        return len(self._first)

    def get(self, key: str, default: Any = None) -> Any:  # Mapping's own goes through __getitem__ and a raise
        return self._first.get(key.lower(), default)

    def getlist(self, key: str) -> list[str]:
        name = key.lower().encode("latin-1")
        return [value.decode("latin-1") for each, value in self._raw if each == name]


class InferRequest(Protocol):
    """What the infer handler reads of a request; Starlette's ``Request`` is one too."""

    @property
    def scope(self) -> Scope: ...

    @property
    def path_params(self) -> dict[str, Any]: ...

    @property
    def headers(self) -> Headers | LaneHeaders: ...

    def stream(self) -> AsyncIterator[bytes]: ...


Handler = Callable[[InferRequest], Awaitable[Rendered]]
Record = Callable[[str, int, float], None]  # model, status, seconds


class LaneBody:
    """A lane request's body as the parser hands it over (``GuardedHttpTools.on_body``): its
    chunks kept as they came, where uvicorn copies each onto one growing buffer (and then
    copies that buffer out). Reading pauses above ``HIGH_WATER`` unread bytes, as uvicorn's
    does: while it is paused the kernel gathers the rest of a large body, which is then read
    in fewer, larger reads (1 MiB instead cost the 301 KB request 90 µs more system time)."""

    HIGH_WATER = 64 * 1024

    __slots__ = ("cycle", "_loop", "_chunks", "_buffered", "_waiter")

    def __init__(self, cycle: RequestResponseCycle, loop: asyncio.AbstractEventLoop) -> None:
        self.cycle = cycle
        self._loop = loop
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        if cycle.body:  # a pipelined request's, collected by uvicorn before its turn came
            self.add(bytes(cycle.body), None)
            cycle.body = bytearray()

    @property
    def pending(self) -> bool:
        return bool(self._chunks)

    def add(self, chunk: bytes, flow: FlowControl | None) -> None:
        if self.cycle.response_complete:  # answered already (a refused body): the rest is dropped
            return
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if flow is not None and self._buffered > self.HIGH_WATER:
            flow.pause_reading()
        self.wake()

    def take(self) -> list[bytes]:
        chunks, self._chunks, self._buffered = self._chunks, [], 0
        return chunks

    def take_one(self) -> bytes | None:
        """The one chunk held, taken; None (nothing taken) unless exactly one is held."""
        if len(self._chunks) != 1:
            return None
        return self.take()[0]

    def news(self) -> asyncio.Future[None]:
        """Done at the next ``wake``: more of the body, its end, or the client gone. (Not the cycle's
        ``asyncio.Event``: in Python 3.11 each wait on one looks up the running loop, a system call.)"""
        self._waiter = waiter = self._loop.create_future()
        return waiter

    def wake(self) -> None:
        """Something happened to the request (the protocol calls it; a wake with no news is harmless)."""
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class LaneRequest:
    """A request on the lane: its scope, and its body as ``LaneBody`` collects it."""

    __slots__ = ("_cycle", "_body", "path_params", "_headers")

    def __init__(self, body: LaneBody, path_params: dict[str, Any]) -> None:
        self._cycle = body.cycle
        self._body = body
        self.path_params = path_params
        self._headers: LaneHeaders | None = None

    @property
    def scope(self) -> Scope:
        return self._cycle.scope  # type: ignore[return-value]

    @property
    def headers(self) -> LaneHeaders:
        if self._headers is None:
            self._headers = LaneHeaders(self._cycle.scope["headers"])  # type: ignore[arg-type]
        return self._headers

    def whole(self) -> bytes | None:
        """The body, when all of it has arrived in one chunk and nothing is left to wait for
        (most small requests): read without ``stream``. Else None, and nothing is taken."""
        cycle, body = self._cycle, self._body
        if cycle.more_body or cycle.waiting_for_100_continue or cycle.disconnected or cycle.response_complete:
            return None
        chunk = body.take_one()
        if chunk is not None:
            cycle.flow.resume_reading()
        return chunk

    async def stream(self) -> AsyncIterator[bytes]:
        """The body's chunks as they arrive; ``ClientDisconnect`` if the client goes first
        (as uvicorn's ``receive`` reads them, ``Expect: 100-continue`` answered first)."""
        cycle, body = self._cycle, self._body
        while True:
            if cycle.waiting_for_100_continue and not cycle.transport.is_closing():
                cycle.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                cycle.waiting_for_100_continue = False
            if cycle.more_body and not body.pending and not cycle.disconnected and not cycle.response_complete:
                cycle.flow.resume_reading()
                await body.news()
            if cycle.disconnected or cycle.response_complete:
                raise ClientDisconnect()
            for chunk in body.take():
                yield chunk
            cycle.flow.resume_reading()
            if not cycle.more_body and not body.pending:
                return


class InferLane:
    def __init__(self, infer: Handler, record: Record | None = None, ports_off: Collection[int] = ()) -> None:
        self._infer = infer
        self._record = record
        self._ports_off = frozenset(ports_off)

    def skipping(self, ports: Collection[int]) -> InferLane:
        """This lane, leaving requests to ``ports`` to ASGI."""
        return InferLane(self._infer, self._record, self._ports_off | frozenset(ports))

    def accepts(self, scope: Mapping[str, Any]) -> dict[str, Any] | None:
        """The path parameters of an infer request the lane answers, else None."""
        if scope["method"] != "POST" or scope.get("root_path"):
            return None
        server = scope.get("server")
        if server is not None and server[1] in self._ports_off:
            return None
        return match_infer(scope["path"])

    async def serve(self, body: LaneBody, path_params: dict[str, Any]) -> None:
        cycle = body.cycle
        started, status = perf_counter(), 500  # what fails before its answer is written is a 500
        try:
            rendered = await self._infer(LaneRequest(body, path_params))
            await answer(cycle, rendered)
            status = rendered.status
        except Exception:
            log.exception("http.lane_failed", path=cycle.scope["path"])
            if not cycle.response_started and not cycle.disconnected:
                await answer(cycle, Rendered(b"Internal Server Error", 500, "text/plain; charset=utf-8"))
            else:
                cycle.transport.close()
        finally:
            cycle.on_response = _nothing  # as uvicorn's run_asgi leaves a finished cycle
            if self._record is not None:
                self._record(path_params["model"], status, perf_counter() - started)


async def answer(cycle: RequestResponseCycle, rendered: Rendered) -> None:
    """Write ``rendered`` as the cycle's whole response, and end the cycle."""
    if cycle.flow.write_paused and not cycle.disconnected:
        await cycle.flow.drain()
    if cycle.disconnected:
        return
    head: list[bytes | memoryview] = [STATUS_LINE[rendered.status]]
    for name, value in cycle.default_headers:
        head += (name, b": ", value, b"\r\n")
    body, tail = rendered.body, rendered.tail
    size = len(body) + sum(len(part) for part in tail) if tail else len(body)
    head.append(b"content-type: %s\r\ncontent-length: %d\r\n" % (rendered.media_type.encode(), size))
    if rendered.headers:
        for key, text in rendered.headers.items():
            if "\r" in text or "\n" in text:
                raise ValueError(f"response header {key!r}: a line break in its value")
            head += (key.lower().encode("latin-1"), b": ", text.encode("latin-1"), b"\r\n")
    if not cycle.keep_alive:
        head.append(b"connection: close\r\n")
    head.append(b"\r\n")
    cycle.response_started = True  # (not before: a head that fails to build leaves the 500 to send)
    cycle.waiting_for_100_continue = False
    if size <= _JOINED:
        head.append(body)
        head += tail
        cycle.transport.write(b"".join(head))
    else:  # one vectored send, the body and its tensors not copied
        cycle.transport.writelines((b"".join(head), body, *tail))
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()


def arrived_whole(request: InferRequest) -> bytes | None:
    """A lane request's body when it has all arrived (``LaneRequest.whole``); None otherwise,
    and for any other request: read it from ``stream``."""
    return request.whole() if type(request) is LaneRequest else None


def lane_of(app: ASGIApp) -> InferLane | None:
    """The lane of an app ``gateway.app.create_app`` made; behind a ``PortDispatch``, its main app's,
    off the platform contracts' ports."""
    if isinstance(app, PortDispatch):
        lane = lane_of(app.main)
        return lane.skipping(app.ports) if lane is not None else None
    state = getattr(app, "state", None)
    lane = getattr(state, "infer_lane", None) if state is not None else None
    return lane if isinstance(lane, InferLane) else None


def _nothing() -> None:
    pass
