"""The infer route's own door: ``POST /v2/models/{model}[/versions/{version}]/infer``
goes straight to its handler, past Starlette's router (which tries each route's pattern
in turn) and its exception middleware. The handler answers every error itself
(``gateway.responses.guarded``), so neither has anything to add on this path.
Every other request goes on to the app as it came."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Handler = Callable[[Request], Awaitable[Response]]

# As the app's routes read a path parameter: one segment, neither empty nor holding a '/'.
_INFER = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")


def match_infer(path: str) -> dict[str, str] | None:
    """The path parameters of an infer route's path, else None."""
    match = _INFER.fullmatch(path)
    if match is None:
        return None
    model, version = match.groups()
    return {"model": model} if version is None else {"model": model, "version": version}


class InferDoor:
    def __init__(self, app: ASGIApp, infer: Handler) -> None:
        self._app = app
        self._infer = infer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        params = match_infer(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if params is None:  # under a root path too: the app's router strips it
            await self._app(scope, receive, send)
            return
        scope["path_params"] = params
        response = await self._infer(Request(scope, receive))
        await response(scope, receive, send)
