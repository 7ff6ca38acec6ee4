"""SageMaker's container contract, as Triton's SageMaker mode keeps it.

    GET    /ping                 200 while ready (``ping_mode`` live: while up), else 503
    POST   /invocations          the default model's infer (or generate, generate_stream)
    GET    /models               multi-model endpoints: the models loaded here and their URLs
    POST   /models               load {"model_name": ..., "url": <directory>}
    GET    /models/{name}        one of them
    DELETE /models/{name}        unload it
    POST   /models/{name}/invoke its infer

A body is a V2 infer request; a binary one says its JSON header's length in
``Content-Type: application/vnd.sagemaker-triton.binary+json;json-header-size=N``
and is answered the same way. SageMaker names a multi-model endpoint's model
by a hash (``model_name``) and sends the archive's name in
``X-Amzn-SageMaker-Target-Model``; ferry serves it under that target name (or
the hash, without the header), as Triton does. An answer whose error reads as
running out of memory is a 507, the status that makes SageMaker unload models.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import orjson
import structlog
from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from gateway.catalog import ModelCatalog
from gateway.errors import InvalidRequest
from gateway.management import ModelManager
from gateway.platforms.default_model import default_model
from gateway.platforms.binary_body import BinaryBody
from gateway.platforms.body import read_body
from gateway.platforms.forwarded import Forwarded
from gateway.platforms.model_archive import read_archive
from gateway.responses import error_response, guarded, json_response

log = structlog.get_logger("ferry.gateway.sagemaker")

BINARY = BinaryBody("application/vnd.sagemaker-triton.binary+json")
TARGET_MODEL = "x-amzn-sagemaker-target-model"
LOAD_BODY_LIMIT = 64 * 1024  # a load names a model and a directory
OUT_OF_MEMORY = (b"CUDA out of memory", b"CUDA_OUT_OF_MEMORY", b"Out of memory", b"Out Of Memory",
                 b"out of memory", b"MemoryError", b"OutOfMemory", b"OOM", b"Failed to allocate memory",
                 b"failed to allocate memory", b"No space left on device")


class SageMakerSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    port: int = Field(8080, gt=0, lt=65536)
    default_model: str = ""  # the model /invocations serves; "" with one model in the repository: that one
    inference_type: Literal["infer", "generate", "generate_stream"] = "infer"
    ping_mode: Literal["ready", "live"] = "ready"
    multi_model: bool = False

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ, **given: object) -> SageMakerSettings:
        """What SageMaker's environment says, under what the command line gave."""
        found: dict[str, object] = {}
        if env.get("SAGEMAKER_BIND_TO_PORT"):
            found["port"] = env["SAGEMAKER_BIND_TO_PORT"]
        if env.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"):
            found["default_model"] = env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"]
        if env.get("SAGEMAKER_TRITON_INFERENCE_TYPE"):
            found["inference_type"] = env["SAGEMAKER_TRITON_INFERENCE_TYPE"]
        if env.get("SAGEMAKER_TRITON_PING_MODE"):
            found["ping_mode"] = env["SAGEMAKER_TRITON_PING_MODE"]
        if env.get("SAGEMAKER_MULTI_MODEL"):
            found["multi_model"] = env["SAGEMAKER_MULTI_MODEL"].lower() == "true"
        return cls.model_validate({**found, **{k: v for k, v in given.items() if v is not None}})


def in_sagemaker(env: Mapping[str, str] = os.environ) -> bool:
    """Whether SageMaker started this container (it sets these for its serving containers)."""
    return any(env.get(name) for name in ("SAGEMAKER_BIND_TO_PORT", "SAGEMAKER_MULTI_MODEL",
                                          "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"))


def out_of_memory_as_507(status: int, body: bytes) -> int:
    return 507 if any(marker in body for marker in OUT_OF_MEMORY) else status


@dataclass(frozen=True, slots=True)
class _Loaded:
    target: str  # the name ferry serves it under
    url: str
    members: tuple[str, ...]  # an ensemble's models, loaded with it


class SageMakerApp:
    def __init__(self, main: ASGIApp, catalog: ModelCatalog, manager: ModelManager,
                 settings: SageMakerSettings) -> None:
        self._main = main
        self._catalog = catalog
        self._manager = manager
        self._settings = settings
        self._loaded: dict[str, _Loaded] = {}
        self._lock = asyncio.Lock()

    def app(self) -> Starlette:
        routes = [
            Route("/ping", self._ping, methods=["GET"]),
            Route("/invocations", self._invocations, methods=["POST"]),
        ]
        if self._settings.multi_model:
            routes += [
                Route("/models", self._list, methods=["GET"]),
                Route("/models", self._load, methods=["POST"]),
                Route("/models/{name}", self._get, methods=["GET"]),
                Route("/models/{name}", self._unload, methods=["DELETE"]),
                Route("/models/{name}/invoke", self._invoke, methods=["POST"]),
            ]
        app = Starlette(routes=routes)
        app.add_exception_handler(404, _no_route)
        app.add_exception_handler(405, _no_route)
        return app

    async def _ping(self, request: Request) -> Response:
        path = "/v2/health/ready" if self._settings.ping_mode == "ready" else "/v2/health/live"
        return Forwarded(self._main, "GET", path)

    async def _invocations(self, request: Request) -> Response:
        return await guarded(self._answer(request, None), request.url.path, "sagemaker.unhandled")

    async def _invoke(self, request: Request) -> Response:
        loaded = self._loaded.get(request.path_params["name"])
        if loaded is None:
            return error_response(f"model '{request.path_params['name']}' is not loaded", 404)
        return await guarded(self._answer(request, loaded.target), request.url.path, "sagemaker.unhandled")

    async def _answer(self, request: Request, model: str | None) -> Response:
        if model is None:
            model = default_model(self._catalog, self._settings.default_model,
                                  "--sagemaker-default-model (SAGEMAKER_TRITON_DEFAULT_MODEL_NAME)")
        replace = BINARY.request_headers(request.headers.get("content-type"))
        return Forwarded(self._main, "POST", f"/v2/models/{model}/{self._settings.inference_type}", replace,
                         BINARY.response_headers(), out_of_memory_as_507)

    async def _list(self, request: Request) -> Response:
        models = [{"modelName": name, "modelUrl": loaded.url} for name, loaded in sorted(self._loaded.items())
                  if self._catalog.is_ready(loaded.target)]
        return json_response({"models": models})

    async def _get(self, request: Request) -> Response:
        name = request.path_params["name"]
        loaded = self._loaded.get(name)
        if loaded is None:
            return error_response(f"model '{name}' is not loaded", 404)
        return json_response({"modelName": name, "modelUrl": loaded.url})

    async def _load(self, request: Request) -> Response:
        return await guarded(self._loading(request), request.url.path, "sagemaker.unhandled")

    async def _loading(self, request: Request) -> Response:
        try:
            body = orjson.loads(await read_body(request, LOAD_BODY_LIMIT))
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"the load request is not JSON: {exc}") from None
        if not isinstance(body, dict) or not isinstance(body.get("model_name"), str) \
                or not isinstance(body.get("url"), str) or not body["model_name"]:
            raise InvalidRequest('expected {"model_name": "<name>", "url": "<model directory>"}')
        name, url = body["model_name"], body["url"]
        target = request.headers.get(TARGET_MODEL) or name
        async with self._lock:
            if name in self._loaded or target in (t for e in self._loaded.values() for t in (e.target, *e.members)):
                return error_response(f"model '{name}' is already loaded", 409)  # SageMaker's contract
            models = await asyncio.to_thread(read_archive, url, target)
            log.info("sagemaker.load", model_name=name, target=target, url=url, models=[m.name for m in models])
            done: list[str] = []
            try:
                for model in models:
                    await self._manager.load_with(model.name, model.overrides)
                    done.append(model.name)
            except Exception as exc:
                await self._unload_all(done)
                return error_response(str(exc), out_of_memory_as_507(400, str(exc).encode()))
            self._loaded[name] = _Loaded(target, url, tuple(done[:-1]))
        return Response(status_code=200)

    async def _unload(self, request: Request) -> Response:
        name = request.path_params["name"]
        async with self._lock:
            loaded = self._loaded.pop(name, None)
            if loaded is None:
                return error_response(f"model '{name}' is not loaded", 404)
            try:
                await self._manager.unload(loaded.target, None)
            except Exception as exc:
                self._loaded[name] = loaded
                return error_response(str(exc), 400)
            await self._unload_all(loaded.members)
        return Response(status_code=200)

    async def _unload_all(self, names: tuple[str, ...] | list[str]) -> None:
        for name in reversed(names):
            try:
                await self._manager.unload(name, None)
            except Exception as exc:  # already failing or done: say so and go on with the rest
                log.warning("sagemaker.unload_failed", model=name, error=str(exc))


async def _no_route(request: Request, exc: Exception) -> Response:
    return error_response(f"no SageMaker route for {request.method} {request.url.path}", 400)
