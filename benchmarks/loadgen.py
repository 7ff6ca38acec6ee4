"""A light closed-loop HTTP/1.1 load generator for KServe V2 inference.

The client shares the machine's cores with the server, so it does as little as it can:
one keep-alive connection per concurrent worker (``asyncio.open_connection``), request
bytes built once, and a response parsed only as far as its status line, ``Content-Length``
and ``Inference-Header-Content-Length``. Latency is measured with ``time.perf_counter``;
only requests that complete inside the measurement window (after the warm-up) count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

HEADER_LENGTH = b"inference-header-content-length"


class LoadError(Exception):
    """A response that is not what the benchmark expects."""


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    request: bytes                  # a complete HTTP/1.1 request, sent as is
    # output bytes after the JSON header of a good response; None: a good response is all JSON
    expected_binary_bytes: int | None


@dataclass(frozen=True, slots=True)
class LoadSpec:
    concurrency: int
    warmup_s: float
    duration_s: float
    grace_s: float = 10.0           # how long requests in flight at the end may take to finish


@dataclass(slots=True)
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None

    def fail(self, reason: str) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = reason


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    shape: Sequence[int]
    data: bytes


@dataclass(frozen=True, slots=True)
class Window:
    """When the measured part of a load runs, in ``perf_counter`` time."""

    start: float
    end: float


# One closed-loop client: sends, waits, records into the result, until the window ends.
Client = Callable[[Window, LoadResult], Awaitable[None]]


def infer_request(host: str, port: int, model: str, tensor: TensorSpec) -> bytes:
    """One V2 infer request with the input as binary data and every output asked for as binary."""
    header = json.dumps({
        "inputs": [{
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
            "parameters": {"binary_data_size": len(tensor.data)},
        }],
        "parameters": {"binary_data_output": True},
    }, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}
    return http_request(host, port, "POST", f"/v2/models/{model}/infer", header + tensor.data, headers)


def http_request(host: str, port: int, method: str, path: str, body: bytes = b"",
                 headers: dict[str, str] | None = None) -> bytes:
    """A complete HTTP/1.1 request with a ``Content-Length``, ready to send as is."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}",
             *(f"{name}: {value}" for name, value in (headers or {}).items()),
             f"Content-Length: {len(body)}", "", ""]
    return "\r\n".join(lines).encode() + body


@dataclass(frozen=True, slots=True)
class HttpReply:
    status: int
    body: bytes
    header_length: int | None   # Inference-Header-Content-Length: binary outputs follow the JSON
    closing: bool = False       # the server said ``Connection: close``


async def read_response(reader: asyncio.StreamReader) -> HttpReply:
    """One response with a ``Content-Length`` body (all ferry sends on these routes)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    content_length = 0
    header_length = None
    closing = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            content_length = int(value)
        elif name == HEADER_LENGTH:
            header_length = int(value)
        elif name == b"connection":
            closing = value.strip().lower() == b"close"
    body = await reader.readexactly(content_length)
    return HttpReply(status, body, header_length, closing)


def _problem(target: Target, reply: HttpReply) -> str | None:
    if reply.status != 200:
        return f"HTTP {reply.status}: {reply.body[:200]!r}"
    if target.expected_binary_bytes is None:
        json_outputs = reply.header_length is None and reply.body.startswith(b"{") and b'"outputs"' in reply.body
        return None if json_outputs else f"not a V2 JSON response: {reply.body[:200]!r}"
    if reply.header_length is None:
        return "response has no Inference-Header-Content-Length (outputs were not binary)"
    if len(reply.body) - reply.header_length != target.expected_binary_bytes:
        return f"{len(reply.body) - reply.header_length} output bytes, expected {target.expected_binary_bytes}"
    return None


async def probe(target: Target) -> dict[str, Any]:
    """Send one request and return its JSON header, raising ``LoadError`` when it is wrong."""
    reader, writer = await asyncio.open_connection(target.host, target.port)
    try:
        writer.write(target.request)
        await writer.drain()
        reply = await read_response(reader)
    finally:
        writer.close()
    problem = _problem(target, reply)
    if problem is not None:
        raise LoadError(problem)
    return json.loads(reply.body[:reply.header_length])


async def _worker(target: Target, window: Window, result: LoadResult) -> None:
    reader, writer = await asyncio.open_connection(target.host, target.port)
    try:
        while (start := perf_counter()) < window.end:
            try:
                writer.write(target.request)
                await writer.drain()
                reply = await read_response(reader)
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                result.fail(f"connection: {exc!r}")
                writer.close()
                reader, writer = await asyncio.open_connection(target.host, target.port)
                continue
            record(result, window, start, lambda: _problem(target, reply))
    finally:
        writer.close()


def record(result: LoadResult, window: Window, start: float, problem: Callable[[], str | None]) -> None:
    """A reply that has just come back to a request sent at ``start``: its latency when it is
    right, a failure when ``problem()`` says what is wrong; nothing outside the window."""
    end = perf_counter()
    if not window.start <= end <= window.end:
        return
    wrong = problem()
    if wrong is None:
        result.latencies_s.append(end - start)
    else:
        result.fail(wrong)


async def run_load(target: Target, spec: LoadSpec) -> LoadResult:
    """Closed loop: ``spec.concurrency`` workers, each sending its next request when the last returns."""
    return await run_clients(lambda window, result: _worker(target, window, result), spec)


async def run_clients(client: Client, spec: LoadSpec) -> LoadResult:
    """``spec.concurrency`` copies of ``client`` at once, all measured in one window."""
    result = LoadResult()
    now = perf_counter()
    window = Window(now + spec.warmup_s, now + spec.warmup_s + spec.duration_s)
    tasks = [asyncio.create_task(client(window, result)) for _ in range(spec.concurrency)]
    done, pending = await asyncio.wait(tasks, timeout=spec.warmup_s + spec.duration_s + spec.grace_s)
    for task in pending:
        task.cancel()
        result.fail("request still in flight after the grace period")
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for task in done:
        if task.exception() is not None:
            result.fail(f"worker failed: {task.exception()!r}")
    return result


def event_loop_runner() -> asyncio.Runner:
    """An asyncio runner on uvloop when it is installed, the standard loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)
