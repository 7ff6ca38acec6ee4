"""HTTP routes of Triton's shared memory extensions:

    GET  /v2/systemsharedmemory[/region/{name}]/status      [{"name", "key", "offset", "byte_size"}, ...]
    POST /v2/systemsharedmemory/region/{name}/register      body {"key": "/k", "offset": 0, "byte_size": 64}
    POST /v2/systemsharedmemory[/region/{name}]/unregister  one region, or all of them

CUDA shared memory has the same routes under ``/v2/cudasharedmemory``, as in a
Triton built without GPUs: no region is ever registered there, so status lists
none and unregister has nothing to do (tritonclient's examples call it first).

Register and unregister answer 501 unless the server allows client shared
memory (``--allow-client-shm``), as Triton does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import InvalidRequest
from gateway.json_tensors import json_name
from gateway.responses import guarded
from gateway.shared_memory.regions import SharedMemoryRegions

BodyReader = Callable[[Request], Awaitable[bytes]]
_REGISTER = "Shared memory register request"


class SharedMemoryRoutes:
    def __init__(self, regions: SharedMemoryRegions, read_body: BodyReader) -> None:
        self._regions = regions
        self._read_body = read_body

    def routes(self) -> list[Route]:
        routes: list[Route] = []
        for kind, status, register, unregister in (
            ("system", self._status, self._register, self._unregister),
            ("cuda", self._cuda_status, self._cuda_register, self._cuda_unregister),
        ):
            prefix, region = f"/v2/{kind}sharedmemory", f"/v2/{kind}sharedmemory/region/{{name}}"
            routes += [
                Route(f"{prefix}/status", self._guard(status), methods=["GET"]),
                Route(f"{region}/status", self._guard(status), methods=["GET"]),
                Route(f"{region}/register", self._guard(register), methods=["POST"]),
                Route(f"{region}/unregister", self._guard(unregister), methods=["POST"]),
                Route(f"{prefix}/unregister", self._guard(unregister), methods=["POST"]),
            ]
        return routes

    async def _status(self, request: Request) -> Response:
        return _json(self._regions.status(request.path_params.get("name")))

    async def _register(self, request: Request) -> Response:
        self._regions.check_enabled()
        body = _register_request(await self._read_body(request))
        key = _field(body, "key")
        if not isinstance(key, str):
            raise InvalidRequest(f"{_REGISTER} field 'key' must be a string, got {json_name(key)}")
        offset = _count(body.get("offset", 0), "offset")
        byte_size = _count(_field(body, "byte_size"), "byte_size")
        self._regions.register(request.path_params["name"], key, offset, byte_size)
        return Response(status_code=200)

    async def _unregister(self, request: Request) -> Response:
        name = request.path_params.get("name")
        if name is None:
            self._regions.unregister_all()
        else:
            self._regions.unregister(name)
        return Response(status_code=200)

    async def _cuda_status(self, request: Request) -> Response:
        return _json(self._regions.cuda_status(request.path_params.get("name")))

    async def _cuda_register(self, request: Request) -> Response:
        self._regions.cuda_register(request.path_params["name"])
        return Response(status_code=200)  # not reached: no CUDA region can be registered

    async def _cuda_unregister(self, request: Request) -> Response:
        self._regions.cuda_unregister()
        return Response(status_code=200)

    def _guard(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            return await guarded(handler(request), request.url.path, "shared_memory.unhandled")
        return route


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


def _register_request(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"{_REGISTER} is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"{_REGISTER} must be a JSON object, got {json_name(body)}")
    return body


def _field(body: dict[str, Any], name: str) -> Any:
    if name not in body:
        raise InvalidRequest(f"{_REGISTER} has no '{name}' field")
    return body[name]


def _count(value: Any, name: str) -> int:
    if type(value) is not int or value < 0:
        raise InvalidRequest(f"{_REGISTER} field '{name}' must be a non-negative integer, got {value!r}")
    return value
