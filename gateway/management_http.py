"""HTTP routes of Triton's model repository extension:

    POST /v2/repository/index                  body {"ready": true} lists only ready versions
    POST /v2/repository/models/{m}/load        body {"parameters": {"config": ..., "file:1/x": ...}}
    POST /v2/repository/models/{m}/unload      body {"parameters": {"unload_dependents": bool}}

With a ``Restriction`` (Triton's ``--http-restricted-api=model-repository:H=V``)
each needs header ``H`` with value ``V``, else 403.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import InvalidRequest
from gateway.json_body import json_object
from gateway.management import ModelManager
from gateway.responses import error_response, guarded

CATEGORY = "model-repository"
BodyReader = Callable[[Request], Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
class Restriction:
    header: str
    value: str

    @classmethod
    def parse(cls, flag: str) -> Restriction:
        """``model-repository:<header>=<value>``, as Triton's --http-restricted-api takes it."""
        category, _, rule = flag.partition(":")
        header, _, value = rule.partition("=")
        if category != CATEGORY or not header or not value:
            raise ValueError(f"expected {CATEGORY}:<header>=<value>, got {flag!r}")
        return cls(header.strip().lower(), value)

    def allows(self, request: Request) -> bool:
        given = request.headers.get(self.header)
        return given is not None and hmac.compare_digest(given.encode(), self.value.encode())


class ManagementRoutes:
    def __init__(self, manager: ModelManager, read_body: BodyReader, restriction: Restriction | None = None) -> None:
        self._manager = manager
        self._read_body = read_body
        self._restriction = restriction

    def routes(self) -> list[Route]:
        return [
            Route("/v2/repository/index", self.index, methods=["POST"]),
            Route("/v2/repository/models/{model}/load", self.load, methods=["POST"]),
            Route("/v2/repository/models/{model}/unload", self.unload, methods=["POST"]),
            Route("/v2/repository/models/{rest:path}", self.bad_path, methods=["POST"]),
        ]

    async def index(self, request: Request) -> Response:
        return await self._guarded(request, self._index)

    async def load(self, request: Request) -> Response:
        return await self._guarded(request, self._load)

    async def unload(self, request: Request) -> Response:
        return await self._guarded(request, self._unload)

    async def bad_path(self, request: Request) -> Response:
        return await self._guarded(request, self._bad_path)

    async def _index(self, request: Request) -> Response:
        body = await self._json(request)
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidRequest("index field 'ready' must be true or false")
        return Response(orjson.dumps(self._manager.index(ready)), media_type="application/json")

    async def _load(self, request: Request) -> Response:
        body = await self._json(request)
        await self._manager.load(request.path_params["model"], body.get("parameters"))
        return Response(status_code=200)

    async def _unload(self, request: Request) -> Response:
        body = await self._json(request)
        await self._manager.unload(request.path_params["model"], body.get("parameters"))
        return Response(status_code=200)

    async def _bad_path(self, request: Request) -> Response:
        rest = request.path_params["rest"]
        raise InvalidRequest(f"invalid model repository path '{rest}': expected "
                             "/v2/repository/models/<model>/load or /unload, a model name without '/'")

    async def _json(self, request: Request) -> dict[str, Any]:
        return json_object(await self._read_body(request))

    async def _guarded(self, request: Request, handler: Callable[[Request], Awaitable[Response]]) -> Response:
        if self._restriction is not None and not self._restriction.allows(request):
            return error_response(f"This API is restricted, expecting header '{self._restriction.header}'", 403)
        return await guarded(handler(request), request.url.path, "management.unhandled")

