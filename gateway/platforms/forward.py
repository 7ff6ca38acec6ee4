"""Calling the main V2 app from a platform route, in-process, over ASGI.

``forward`` hands the live request on under another method and path (its body
streams through unread); ``call`` sends a body of its own and collects the
answer. Either way the main app's middleware (metrics) and error handling see
the request as one of their own."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

Headers = list[tuple[bytes, bytes]]


def rerouted(scope: Scope, method: str, path: str, replace: dict[bytes, bytes | None] | None = None) -> Scope:
    """``scope`` as if the client had sent ``method path``, its headers updated by
    ``replace`` (lower-case names; ``None`` drops one)."""
    replace = replace or {}
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in replace]
    headers += [(k, v) for k, v in replace.items() if v is not None]
    return {**scope, "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
            "headers": headers, "root_path": ""}


async def forward(app: ASGIApp, scope: Scope, receive: Receive, send: Send, method: str, path: str,
                  replace: dict[bytes, bytes | None] | None = None,
                  answer: Callable[[Headers], Headers] | None = None,
                  failure: Callable[[int, bytes], int] | None = None) -> None:
    """Let ``app`` answer the request as ``method path``. On the way out,
    ``answer`` may rewrite the response headers, and ``failure`` the status of
    an error (4xx or 5xx) from its body, which is then held until complete."""
    held: list[Message] = []

    async def out(message: Message) -> None:
        if message["type"] == "http.response.start":
            if answer is not None:
                message = {**message, "headers": answer(list(message.get("headers", [])))}
            if failure is not None and message["status"] >= 400:
                held.append(message)
                return
        elif held and failure is not None and message["type"] == "http.response.body":
            held.append(message)
            if message.get("more_body", False):
                return
            body = b"".join(m.get("body", b"") for m in held[1:])
            await send({**held[0], "status": failure(held[0]["status"], body)})
            message = {"type": "http.response.body", "body": body, "more_body": False}
        await send(message)

    await app(rerouted(scope, method, path, replace), receive, out)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: Headers
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k.lower() == name), None)


async def call(app: ASGIApp, scope: Scope, receive: Receive, method: str, path: str, body: bytes = b"",
               replace: dict[bytes, bytes | None] | None = None) -> Answer:
    """``app``'s whole answer to ``method path`` with ``body``. The client's own
    ``receive`` still reports its disconnect once the body is given."""
    sent = False
    parts: list[bytes] = []
    start: Message = {}
    size = {b"content-length": str(len(body)).encode(), b"content-encoding": None}

    async def given() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    async def collect(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            start = message
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await app(rerouted(scope, method, path, {**size, **(replace or {})}), given, collect)
    return Answer(int(start.get("status", 500)), list(start.get("headers", [])), b"".join(parts))


def without(headers: Iterable[tuple[bytes, bytes]], *names: bytes) -> Headers:
    return [(k, v) for k, v in headers if k.lower() not in names]
