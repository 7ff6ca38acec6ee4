"""Vertex AI's custom-container contract, on ``AIP_HTTP_PORT``.

    GET  $AIP_HEALTH_ROUTE   200 while every model is ready, else 503
    POST $AIP_PREDICT_ROUTE  {"instances": [...], "parameters": {...}} in,
                             {"predictions": [...]} out (``instances.py``)

The predict route also takes what Triton's Vertex AI mode takes: a V2 infer
request for the default model (binary with ``Content-Type:
application/vnd.vertex-ai-triton.binary+json;json-header-size=N``), and,
with ``X-Vertex-Ai-Triton-Redirect: <V2 path>``, any V2 route, since Vertex
sends nothing but POSTs to the predict route. Errors are ``{"error": ...}``
with the V2 status.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from gateway.catalog import ModelCatalog
from gateway.errors import InvalidRequest
from gateway.platforms.default_model import default_model
from gateway.platforms.binary_body import HEADER_LENGTH, BinaryBody
from gateway.platforms.body import read_body
from gateway.platforms.forward import call
from gateway.platforms.forwarded import Forwarded
from gateway.platforms.instances import predictions_from, requests_for
from gateway.responses import error_response, guarded, json_response

BINARY = BinaryBody("application/vnd.vertex-ai-triton.binary+json")
REDIRECT = "x-vertex-ai-triton-redirect"
# The V2 routes a redirect may reach with a POST of their own; every other one is read with a GET.
_POSTED = ("/infer", "/load", "/unload", "/register", "/unregister", "/index", "/trace/setting", "/logging")


class VertexSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    port: int = Field(8080, gt=0, lt=65536)
    health_route: str = Field(pattern=r"^/")
    predict_route: str = Field(pattern=r"^/")
    default_model: str = ""  # "" with one model in the repository: that one
    max_body_bytes: int = 64 * 1024 * 1024

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ, **given: object) -> VertexSettings:
        missing = [name for name in ("AIP_HEALTH_ROUTE", "AIP_PREDICT_ROUTE") if not env.get(name)]
        if missing:
            raise ValueError(f"{missing[0]} is not set: Vertex AI sets it for a custom container, and ferry's "
                             "Vertex AI mode needs it")
        found: dict[str, object] = {"health_route": env["AIP_HEALTH_ROUTE"], "predict_route": env["AIP_PREDICT_ROUTE"]}
        if env.get("AIP_HTTP_PORT"):
            found["port"] = env["AIP_HTTP_PORT"]
        return cls.model_validate({**found, **{k: v for k, v in given.items() if v is not None}})


def in_vertex(env: Mapping[str, str] = os.environ) -> bool:
    """Whether Vertex AI started this container to serve predictions."""
    return env.get("AIP_MODE", "").upper() == "PREDICTION"


class VertexApp:
    def __init__(self, main: ASGIApp, catalog: ModelCatalog, settings: VertexSettings) -> None:
        self._main = main
        self._catalog = catalog
        self._settings = settings

    def app(self) -> Starlette:
        app = Starlette(routes=[
            Route(self._settings.health_route, self._health, methods=["GET"]),
            Route(self._settings.predict_route, self._predict, methods=["POST"]),
        ])
        app.add_exception_handler(404, _no_route)
        app.add_exception_handler(405, _no_route)
        return app

    async def _health(self, request: Request) -> Response:
        return Forwarded(self._main, "GET", "/v2/health/ready")

    async def _predict(self, request: Request) -> Response:
        return await guarded(self._predicting(request), request.url.path, "vertex.unhandled")

    async def _predicting(self, request: Request) -> Response:
        redirect = request.headers.get(REDIRECT)
        if redirect is not None:
            path = "/" + redirect.lstrip("/")
            posted = path.endswith(_POSTED) or ("/sharedmemory/" in path and not path.endswith("/status"))
            method = "POST" if posted else "GET"
            return Forwarded(self._main, method, path)
        model = default_model(self._catalog, self._settings.default_model, "--vertex-ai-default-model")
        content_type = request.headers.get("content-type")
        if content_type is not None and BINARY.prefix in content_type:
            return Forwarded(self._main, "POST", f"/v2/models/{model}/infer", BINARY.request_headers(content_type),
                             BINARY.response_headers())
        body = await read_body(request, self._settings.max_body_bytes)
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"the request body is not JSON: {exc}") from None
        if not (isinstance(parsed, dict) and "instances" in parsed):
            answer = await call(self._main, request.scope, request.receive, "POST", f"/v2/models/{model}/infer", body,
                                {HEADER_LENGTH: None, b"accept-encoding": None})
            # Binary outputs the JSON body asked for keep their header length, in Vertex's content type.
            kept = [(k.decode(), v.decode()) for k, v in BINARY.response_headers()(answer.headers)
                    if k.lower() != b"content-length"]
            return Response(answer.body, answer.status, headers=dict(kept))
        return await self._instances(request, model, parsed)

    async def _instances(self, request: Request, model: str, parsed: dict[str, Any]) -> Response:
        config = self._catalog.entry(model).config
        unknown = sorted(set(parsed) - {"instances", "parameters"})
        if unknown:
            raise InvalidRequest(f"unknown field '{unknown[0]}': a Vertex AI request has 'instances' and 'parameters'")
        requests = requests_for(config, parsed["instances"], parsed.get("parameters"))
        answers = await asyncio.gather(*(
            call(self._main, request.scope, request.receive, "POST", f"/v2/models/{model}/infer", r.body,
                 {HEADER_LENGTH: None if r.header_length is None else str(r.header_length).encode(),
                  b"content-type": b"application/json", b"accept-encoding": None})
            for r in requests))
        for answer in answers:
            if answer.status != 200:
                return Response(answer.body, answer.status, media_type="application/json")
        rows = [r.rows for r in requests]
        predictions = predictions_from(config, [orjson.loads(a.body) for a in answers], rows)
        return json_response({"predictions": predictions})

async def _no_route(request: Request, exc: Exception) -> Response:
    return error_response(f"no Vertex AI route for {request.method} {request.url.path}", 400)
