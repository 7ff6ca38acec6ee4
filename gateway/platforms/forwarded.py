"""A route's answer that is the main app's answer to another request (``forward``)."""

from __future__ import annotations

from collections.abc import Callable

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.platforms.forward import Headers, forward


class Forwarded(Response):
    def __init__(self, app: ASGIApp, method: str, path: str, replace: dict[bytes, bytes | None] | None = None,
                 answer: Callable[[Headers], Headers] | None = None,
                 failure: Callable[[int, bytes], int] | None = None) -> None:
        super().__init__()
        self._target = (app, method, path, replace, answer, failure)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app, method, path, replace, answer, failure = self._target
        await forward(app, scope, receive, send, method, path, replace, answer, failure)
