"""Streaming doors onto the service: Server-Sent Events and a WebSocket.

    POST /v2/models/{m}/generate          generate extension, one response
    POST /v2/models/{m}/generate_stream   generate extension, an SSE event per response
    POST /v2/models/{m}/infer_stream      a V2 infer body, an SSE event per V2 response
    WS   /v2/models/{m}/stream            V2 infer requests in, V2 responses out

Every streamed V2 response carries ``parameters.triton_final_response``; the
final one may have no outputs (a decoupled model's end of stream). An error
after the stream began is an event ``{"error": "..."}``, the last one.

On the WebSocket a text message is a V2 infer JSON body; a binary message is
a 4-byte little-endian length, that many bytes of V2 JSON, then the binary
tensor data (the V2 binary extension). Requests are published in the order
they arrive, so the steps of a sequence keep their order; responses are sent
as they come, each with the ``id`` of its request.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import orjson
import structlog
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect

from broker.envelope import Response as Reply
from gateway.errors import GatewayError, InvalidRequest
from gateway.generate import parse_generate_request, render_generate_response
from gateway.service import InferenceService
from gateway.v2_codec import ParsedInfer, parse_infer_request, render_infer_response
from gateway.tracing import caller_context
from gateway.status import ANSWERED, BROKER_DOWN
from workers.errors import WorkerError
from workers.worker import FINAL_FLAG as FINAL

log = structlog.get_logger("ferry.gateway.streams")

Render = Callable[[Reply], dict[str, Any]]
Target = tuple[str, str]


def render_v2(reply: Reply) -> dict[str, Any]:
    tagged = replace(reply, parameters={**reply.parameters, FINAL: reply.final})
    header, _ = render_infer_response(tagged, (), binary_default=False)
    return orjson.loads(header)  # type: ignore[no-any-return]


def render_error(reply: Reply | None, message: str, request_id: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {"error": message, "parameters": {FINAL: True}}
    if request_id or (reply is not None and reply.id):
        body["id"] = request_id or (reply.id if reply is not None else "")
    return body


async def rendered(replies: AsyncIterator[Reply], render: Render, skip_empty_final: bool,
                   request_id: str = "") -> AsyncIterator[dict[str, Any]]:
    """Each reply as a JSON-ready object; an error ends the stream."""
    try:
        async for reply in replies:
            if reply.error is not None:
                yield render_error(reply, reply.error.message, request_id)
                return
            if skip_empty_final and reply.final and not reply.outputs:
                return
            yield render(reply)
    except (GatewayError, WorkerError) as exc:
        yield render_error(None, str(exc), request_id)


def sse(events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def lines() -> AsyncIterator[bytes]:
        async for event in events:
            yield b"data: " + orjson.dumps(event) + b"\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class StreamRoutes:
    def __init__(self, service: InferenceService, read_body: Callable[[Request], Awaitable[bytes]],
                 target: Callable[[Any], Target], header_length: Callable[[Request], int | None],
                 max_message_bytes: int) -> None:
        self._service = service
        self._read_body = read_body
        self._target = target
        self._header_length = header_length
        self._max_message_bytes = max_message_bytes

    async def generate(self, request: Request) -> Response:
        name, version, parsed = await self._generate_body(request)
        replies = await self._service.stream(name, version, parsed, caller_context(request.headers))
        answers = [event async for event in rendered(replies, render_generate_response, True)]
        errors = [a for a in answers if "error" in a]
        if errors:
            raise InvalidRequest(errors[0]["error"])
        if len(answers) != 1:
            raise InvalidRequest(f"model '{name}' sent {len(answers)} responses; use generate_stream")
        return Response(orjson.dumps(answers[0]), media_type="application/json")

    async def generate_stream(self, request: Request) -> Response:
        name, version, parsed = await self._generate_body(request)
        replies = await self._service.stream(name, version, parsed, caller_context(request.headers))
        return sse(rendered(replies, render_generate_response, skip_empty_final=True))

    async def infer_stream(self, request: Request) -> Response:
        name, version = self._target(request)
        self._service.catalog.version(name, version)
        parsed = parse_infer_request(await self._read_body(request), self._header_length(request))
        replies = await self._service.stream(name, version, parsed, caller_context(request.headers))
        return sse(rendered(replies, render_v2, skip_empty_final=False))

    async def websocket(self, socket: WebSocket) -> None:
        await socket.accept()
        sender = _Sender(socket)
        try:
            while True:
                message = await socket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                await self._one(socket, sender, message)
        except WebSocketDisconnect:
            pass
        finally:
            await sender.aclose()

    async def _generate_body(self, request: Request) -> tuple[str, str, ParsedInfer]:
        name, version = self._target(request)
        entry, _ = self._service.catalog.version(name, version)
        return name, version, parse_generate_request(await self._read_body(request), entry.config)

    async def _one(self, socket: WebSocket, sender: _Sender, message: Message) -> None:
        request_id = ""
        try:
            name, version = self._target(socket)
            self._service.catalog.version(name, version)
            parsed = self._ws_request(message)
            request_id = parsed.id
            replies = await self._service.stream(name, version, parsed)
        except ANSWERED as exc:  # this request fails, the socket stays
            if isinstance(exc, BROKER_DOWN):
                log.warning("ws.broker_unavailable", error=str(exc))
            await sender.send(render_error(None, str(exc), request_id))
            return
        except Exception as exc:
            log.exception("ws.request_failed", error=str(exc))
            await sender.send(render_error(None, f"internal error: {type(exc).__name__}: {exc}", request_id))
            return
        sender.pump(rendered(replies, render_v2, skip_empty_final=False, request_id=request_id))

    def _ws_request(self, message: Message) -> ParsedInfer:
        text, data = message.get("text"), message.get("bytes")
        size = len(text.encode()) if text is not None else len(data or b"")
        if size > self._max_message_bytes:
            raise InvalidRequest(f"message of {size} bytes exceeds the {self._max_message_bytes}-byte limit")
        if text is not None:
            return parse_infer_request(text.encode(), None)
        if data is None or len(data) < 4:
            raise InvalidRequest("a binary message starts with the 4-byte length of its JSON header")
        (length,) = struct.unpack_from("<I", data, 0)
        return parse_infer_request(data[4:], length)


class _Sender:
    """Sends one socket's responses as they come; one send at a time."""

    def __init__(self, socket: WebSocket) -> None:
        self._socket = socket
        self._lock = asyncio.Lock()
        self._pumps: set[asyncio.Task[None]] = set()

    async def send(self, event: dict[str, Any]) -> None:
        async with self._lock:
            await self._socket.send_text(orjson.dumps(event).decode())

    def pump(self, events: AsyncIterator[dict[str, Any]]) -> None:
        task = asyncio.create_task(self._drain(events))
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)

    async def _drain(self, events: AsyncIterator[dict[str, Any]]) -> None:
        try:
            async for event in events:
                await self.send(event)
        except (WebSocketDisconnect, RuntimeError) as exc:
            log.debug("ws.send_failed", error=str(exc))

    async def aclose(self) -> None:
        for task in self._pumps:
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
