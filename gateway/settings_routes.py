"""Triton's logging and trace extensions over HTTP:

    GET/POST /v2/logging                      this process's log levels and format (``gateway.logs``)
    GET/POST /v2/trace/setting                which new traces this process starts
    GET/POST /v2/models/{m}/trace/setting     the same for one model (``null`` drops its own value)

A POST changes only the settings it names and answers with all of them. The
settings are this process's: in ``ferry serve`` that is the gateway and its
worker; a fleet's other processes keep theirs (a worker follows the
gateway's sampling decision for every traced request it is sent).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.catalog import ModelCatalog
from gateway.errors import InvalidRequest
from gateway.logs import LogControl
from gateway.json_body import json_object
from gateway.management_http import BodyReader
from gateway.responses import guarded, json_response
from workers.telemetry.tracing.control import TraceControl, TraceSettingError


class SettingsRoutes:
    def __init__(self, logs: LogControl, traces: TraceControl, catalog: ModelCatalog, read_body: BodyReader) -> None:
        self._logs = logs
        self._traces = traces
        self._catalog = catalog
        self._read_body = read_body

    def routes(self) -> list[Route]:
        return [
            Route("/v2/logging", self.logging, methods=["GET", "POST"]),
            Route("/v2/trace/setting", self.trace, methods=["GET", "POST"]),
            Route("/v2/models/{model}/trace/setting", self.trace, methods=["GET", "POST"]),
        ]

    async def logging(self, request: Request) -> Response:
        return await guarded(self._logging(request), request.url.path, "settings.unhandled")

    async def trace(self, request: Request) -> Response:
        return await guarded(self._trace(request), request.url.path, "settings.unhandled")

    async def _logging(self, request: Request) -> Response:
        if request.method == "GET":
            return json_response(self._logs.settings())
        return json_response(self._logs.update(json_object(await self._read_body(request))))

    async def _trace(self, request: Request) -> Response:
        model = request.path_params.get("model", "")
        if model:
            model = self._catalog.entry(model).name  # an unknown one is refused in Triton's words
        if request.method == "GET":
            return json_response(self._traces.settings(model))
        changes = json_object(await self._read_body(request))
        try:
            return json_response(self._traces.update(changes, model))
        except TraceSettingError as exc:
            raise InvalidRequest(str(exc)) from None
