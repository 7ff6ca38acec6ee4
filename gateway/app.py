"""The KServe V2 HTTP API, as Triton serves it. Routes parse, call the
service, and render; errors become ``{"error": ...}`` with Triton's codes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.websockets import WebSocket
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute

from broker.envelope import Response as Reply
from broker.envelope import decode_response
from gateway.catalog import checked_target
from gateway.classification import Classifiers
from gateway.compression import compress, decompress, response_encoding
from gateway.dashboard import Dashboard
from gateway.errors import ClientDisconnected, FeatureDisabled, InvalidRequest, PayloadTooLarge
from gateway.infer_door import InferDoor
from gateway.infer_lane import InferLane, InferRequest, arrived_whole
from gateway.jobs.job import Job, JobStatus
from gateway.jobs.prefer import RESPOND_ASYNC, prefers_async
from gateway.jobs.service import JobService
from gateway.management import ModelManager
from gateway.management_http import ManagementRoutes, Restriction
from gateway.logs import PROCESS_LOGS, LogControl
from gateway.metadata import SERVER_NAME, model_metadata, server_metadata
from gateway.metrics import GatewayMetrics
from gateway.service import InferenceService
from gateway.responses import Rendered, error_response, guard, guarded, json_response, rendered_error, rendered_json
from gateway.settings_routes import SettingsRoutes
from gateway.shared_memory.binding import bind
from gateway.shared_memory.regions import SharedMemoryRegions
from gateway.shared_memory.routes import SharedMemoryRoutes
from gateway.status import status_for_code
from gateway.statistics import Statistics
from gateway.streams import StreamRoutes
from gateway.tracing import caller_context
from gateway.v2_codec import Classify, RequestedOutput, parse_infer_request, render_infer_parts
from workers.decimal_text import ascii_int
from workers.telemetry.tracing.control import TraceControl

log = structlog.get_logger("ferry.gateway.http")

HEADER_LENGTH = "inference-header-content-length"


@dataclass(frozen=True, slots=True)
class HttpSettings:
    max_body_bytes: int = 64 * 1024 * 1024
    restriction: Restriction | None = None  # model-repository routes need this header
    allow_client_shm: bool = False  # Triton's --allow-client-shm: clients may register shared memory
    server_name: str = SERVER_NAME  # what GET /v2 calls this server ("triton" for tools that check)


Lifespan = Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]


def create_app(service: InferenceService, settings: HttpSettings = HttpSettings(),
               lifespan: Lifespan | None = None, jobs: JobService | None = None,
               manager: ModelManager | None = None, metrics: GatewayMetrics | None = None,
               dashboard: Dashboard | None = None, regions: SharedMemoryRegions | None = None,
               statistics: Statistics | None = None, traces: TraceControl | None = None,
               logs: LogControl = PROCESS_LOGS) -> Starlette:
    """Without ``jobs``, ``Prefer: respond-async`` is ignored (RFC 7240 lets a
    server decline a preference) and infer answers synchronously. Without
    ``manager``, load and unload are refused (model control mode ``none``).
    Without ``regions`` (which the caller closes), no shared memory can be registered.
    Without ``statistics``, the statistics routes answer 501; without ``traces`` (a process
    that exports no spans), the trace settings report OFF and refuse to turn it on."""
    regions = SharedMemoryRegions(enabled=False) if regions is None else regions
    api = _Api(service, settings, jobs, regions, statistics)
    management = ManagementRoutes(manager or ModelManager(service.catalog, None), api.read_body,
                                  settings.restriction)
    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version}"
    routes: list[BaseRoute] = [
        Route("/v2/health/live", api.live, methods=["GET"]),
        Route("/v2/health/ready", api.ready, methods=["GET"]),
        Route("/v2", api.server, methods=["GET"]),
        Route("/v2/models/stats", api.stats, methods=["GET"]),
        *management.routes(),
        *SharedMemoryRoutes(regions, api.read_body).routes(),
        *SettingsRoutes(logs, traces or TraceControl(enabled=False), service.catalog, api.read_body).routes(),
    ]
    if jobs is not None:
        routes.append(Route("/v2/jobs/{job_id}", api.job, methods=["GET", "DELETE"]))
    for prefix in (model, versioned):
        routes += [
            Route(prefix, api.model, methods=["GET"]),
            Route(prefix + "/config", api.config, methods=["GET"]),
            Route(prefix + "/ready", api.model_ready, methods=["GET"]),
            Route(prefix + "/stats", api.stats, methods=["GET"]),
            Route(prefix + "/infer", api.infer, methods=["POST"]),
            Route(prefix + "/infer_stream", api.infer_stream, methods=["POST"]),
            Route(prefix + "/generate", api.generate, methods=["POST"]),
            Route(prefix + "/generate_stream", api.generate_stream, methods=["POST"]),
            WebSocketRoute(prefix + "/stream", api.streams.websocket),
        ]
    routes.append(Route("/v2/models/{rest:path}", api.bad_model_path, methods=["GET", "POST"]))
    if metrics is not None:
        routes += metrics.routes()
    if dashboard is not None:
        routes += dashboard.routes()
    # Counted first; then the infer route's own door (gateway.infer_door) past the router.
    middleware = [*(metrics.middleware() if metrics else ()), Middleware(InferDoor, infer=api.infer)]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
    app.add_exception_handler(404, _not_found)
    app.add_exception_handler(405, _not_allowed)
    # The same handler, for the HTTP server to answer infer requests with past ASGI (gateway.infer_lane).
    app.state.infer_lane = InferLane(api.answer_infer, metrics.record if metrics else None)
    return app


async def _not_found(request: Request, exc: Exception) -> Response:
    return error_response(f"no route for {request.method} {request.url.path}", 404)


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return error_response(f"method {request.method} is not allowed on {request.url.path}", 405)


class _Api:
    def __init__(self, service: InferenceService, settings: HttpSettings, jobs: JobService | None,
                 regions: SharedMemoryRegions, statistics: Statistics | None) -> None:
        self._service = service
        self._statistics = statistics
        self._jobs = jobs
        self._regions = regions
        self._catalog = service.catalog
        self._settings = settings
        self._classifiers = Classifiers(service.catalog)
        self.streams = StreamRoutes(service, self.read_body, self._target, _header_length, settings.max_body_bytes)

    async def live(self, request: Request) -> Response:
        return Response(status_code=200)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200 if self._catalog.all_ready() else 503)

    async def server(self, request: Request) -> Response:
        return json_response(server_metadata(self._settings.server_name))

    async def model(self, request: Request) -> Response:
        return await self._guard(self._model, request)

    async def config(self, request: Request) -> Response:
        return await self._guard(self._config, request)

    async def model_ready(self, request: Request) -> Response:
        return await self._guard(self._model_ready, request)

    async def infer(self, request: Request) -> Response:
        return (await self.answer_infer(request)).response()

    async def answer_infer(self, request: InferRequest) -> Rendered:
        return await guard(self._infer(request), request.scope["path"], "http.unhandled", rendered_error)

    async def stats(self, request: Request) -> Response:
        return await self._guard(self._stats, request)

    async def job(self, request: Request) -> Response:
        return await self._guard(self._job, request)

    async def infer_stream(self, request: Request) -> Response:
        return await self._guard(self.streams.infer_stream, request)

    async def generate(self, request: Request) -> Response:
        return await self._guard(self.streams.generate, request)

    async def generate_stream(self, request: Request) -> Response:
        return await self._guard(self.streams.generate_stream, request)

    async def bad_model_path(self, request: Request) -> Response:
        rest = request.path_params["rest"]
        return error_response(f"invalid model path '{rest}': a model name must not contain '/'", 400)

    async def _guard(self, handler: Callable[[Request], Any], request: Request) -> Response:
        return await guarded(handler(request), request.scope["path"], "http.unhandled")

    def _target(self, request: InferRequest | Request | WebSocket) -> tuple[str, str]:
        return checked_target(request.path_params["model"], request.path_params.get("version", ""))

    async def _model(self, request: Request) -> Response:
        name, version = self._target(request)
        entry, number = self._catalog.version(name, version)
        versions = (number,) if number is not None else entry.versions
        return json_response(model_metadata(entry.config, versions))

    async def _config(self, request: Request) -> Response:
        name, version = self._target(request)
        entry, _ = self._catalog.version(name, version)
        return json_response(entry.config.to_json())

    async def _model_ready(self, request: Request) -> Response:
        name, version = self._target(request)
        entry, number = self._catalog.version(name, version)
        if self._catalog.is_ready(entry.name, number):
            return Response(status_code=200)
        return error_response(f"model '{name}' is not ready", 400)

    async def _stats(self, request: Request) -> Response:
        if self._statistics is None:
            raise FeatureDisabled("this server keeps no statistics")
        name, version = self._target(request) if "model" in request.path_params else ("", "")
        return json_response(await self._statistics.model_stats(name, version))

    async def _infer(self, request: InferRequest) -> Rendered:
        name, version = self._target(request)
        self._catalog.version(name, version)  # an unknown model is refused before its body is read
        body = await self.read_body(request)
        parsed = parse_infer_request(body, _header_length(request))
        bound = bind(self._regions, parsed)  # inputs read from shared memory, output regions checked
        trace = caller_context(request.headers)
        if self._jobs is not None and prefers_async(request.headers.getlist("prefer")):
            job = await self._jobs.submit(name, version, bound.for_job(), trace)
            return rendered_json({"job_id": job.id, "status": job.status.value}, 202, headers={
                "Location": f"/v2/jobs/{job.id}", "Preference-Applied": RESPOND_ASYNC,
            })
        response = await self._service.infer(name, version, bound.parsed, trace)
        bound.write_outputs(response)
        classify = self._classifiers.for_request(name, parsed.outputs)
        return _render_reply(response, parsed.outputs, parsed.binary_output_default,
                             request.headers.get("accept-encoding"), classify)

    async def _job(self, request: Request) -> Response:
        assert self._jobs is not None  # the route exists only with jobs
        job_id = request.path_params["job_id"]
        job = await (self._jobs.cancel(job_id) if request.method == "DELETE" else self._jobs.get(job_id))
        if job.status == JobStatus.EXPIRED:
            return json_response({**_job_status(job), "error": f"job '{job.id}' has expired"}, 410)
        if request.method == "DELETE":
            return json_response(_job_status(job))
        if job.status == JobStatus.SUCCEEDED:
            reply = decode_response(job.result).with_id(job.rendering.request_id)
            return _render_reply(reply, job.rendering.outputs, job.rendering.binary_default,
                                 request.headers.get("accept-encoding"),
                                 self._classifiers.for_request(job.model, job.rendering.outputs)).response()
        if job.status == JobStatus.FAILED:
            error = decode_response(job.result).error
            return json_response({**_job_status(job), "error": error.message if error else "failed"})
        return json_response(_job_status(job))

    async def read_body(self, request: InferRequest) -> bytes:
        limit = self._settings.max_body_bytes
        declared = request.headers.get("content-length")
        size = ascii_int(declared or "")
        if size is not None and size > limit:
            raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {limit}-byte limit")
        whole = arrived_whole(request)
        if whole is not None:
            if len(whole) > limit:
                raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
            return decompress(whole, request.headers.get("content-encoding"), limit)
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
                chunks.append(chunk)
        except ClientDisconnect:
            # Clients hang up; that is news, not a fault (and the body timeout does it on purpose).
            log.info("http.client_disconnected", path=request.scope["path"], received_bytes=size)
            raise ClientDisconnected(f"the client disconnected after {size} bytes of its request body") from None
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return decompress(body, request.headers.get("content-encoding"), limit)


def _render_reply(reply: Reply, outputs: tuple[RequestedOutput, ...], binary_default: bool,
                  accept_encoding: str | None, classify: Classify | None) -> Rendered:
    """The infer response body, compressed as ``Accept-Encoding`` asks (the JSON header's
    length is the uncompressed one, as in Triton: the client inflates first)."""
    if reply.error is not None:
        return rendered_error(reply.error.message, status_for_code(reply.error.code))
    header, blobs = render_infer_parts(reply, outputs, binary_default, classify)
    headers: dict[str, str] = {}
    if blobs:
        headers["Inference-Header-Content-Length"] = str(len(header))
    media_type = "application/octet-stream" if blobs else "application/json"
    encoding = response_encoding(accept_encoding)
    if encoding is None:
        return Rendered(header, 200, media_type, headers or None, blobs)
    headers["Content-Encoding"] = encoding
    return Rendered(compress(b"".join((header, *blobs)), encoding), 200, media_type, headers)


def _job_status(job: Job) -> dict[str, str]:
    created = datetime.fromtimestamp(job.created_ns / 1e9, UTC).isoformat(timespec="milliseconds")
    return {"job_id": job.id, "model_name": job.model, "model_version": job.model_version,
            "status": job.status.value, "created": created.replace("+00:00", "Z")}


def _header_length(request: InferRequest | Request) -> int | None:
    value = request.headers.get(HEADER_LENGTH)
    if value is None:
        return None
    length = ascii_int(value)
    if length is None:
        raise InvalidRequest(f"Inference-Header-Content-Length '{value}' is not an integer")
    return length


