"""Triton's ``inference.GRPCInferenceService``, answered by the same objects as the HTTP door.

Each RPC turns its message into the call the HTTP route makes (the same
``InferenceService``, catalog, model manager, shared memory regions,
statistics, log and trace settings), so the two doors cannot drift apart;
errors leave with the gRPC status Triton gives them (``gateway.grpc.status``).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2 as pb, service_pb2_grpc

from gateway.catalog import checked_target
from gateway.classification import Classifiers
from gateway.errors import InvalidRequest
from gateway.grpc.status import abort_with
from gateway.grpc.streams import StreamSession
from gateway.grpc.tensors import infer_response, parse_grpc_request
from gateway.logs import LogControl
from gateway.management import ModelManager
from gateway.metadata import model_metadata, server_metadata
from gateway.service import InferenceService
from gateway.shared_memory.binding import bind
from gateway.shared_memory.regions import SharedMemoryRegions
from gateway.statistics import Statistics
from workers.telemetry.tracing.control import TraceControl, TraceSettingError

Message = TypeVar("Message")
_TRACE_KEYS = ("traceparent", "tracestate")


@dataclass(frozen=True, slots=True)
class GrpcParts:
    service: InferenceService
    manager: ModelManager
    regions: SharedMemoryRegions
    statistics: Statistics
    logs: LogControl
    traces: TraceControl
    server_name: str


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, parts: GrpcParts) -> None:
        self._parts = parts
        self._catalog = parts.service.catalog
        self._classifiers = Classifiers(self._catalog)

    # -- health and metadata ---------------------------------------------------

    async def ServerLive(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerReadyResponse(ready=self._catalog.all_ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> Any:
        async def ready() -> Any:
            entry, number = self._catalog.version(*checked_target(request.name, request.version))
            return pb.ModelReadyResponse(ready=self._catalog.is_ready(entry.name, number))
        return await self._answer(ready, context)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerMetadataResponse(**server_metadata(self._parts.server_name))

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext) -> Any:
        async def metadata() -> Any:
            entry, number = self._catalog.version(*checked_target(request.name, request.version))
            body = model_metadata(entry.config, (number,) if number is not None else entry.versions)
            return json_format.ParseDict(body, pb.ModelMetadataResponse())
        return await self._answer(metadata, context)

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext) -> Any:
        async def config() -> Any:
            entry, _ = self._catalog.version(*checked_target(request.name, request.version))
            proto = json_format.ParseDict(entry.config.to_json(), model_config_pb2.ModelConfig(),
                                          ignore_unknown_fields=True)
            return pb.ModelConfigResponse(config=proto)
        return await self._answer(config, context)

    # -- inference -------------------------------------------------------------

    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> Any:
        async def infer() -> Any:
            name, version = checked_target(request.model_name, request.model_version)
            self._catalog.version(name, version)  # an unknown model is refused before anything else
            parsed = parse_grpc_request(request)
            bound = bind(self._parts.regions, parsed)
            response = await self._parts.service.infer(name, version, bound.parsed, _trace_context(context))
            if response.error is not None:
                await abort_with(context, response.error)
            bound.write_outputs(response)
            return infer_response(response, parsed, self._classifiers.for_request(name, parsed.outputs))
        return await self._answer(infer, context)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest],
                               context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ModelStreamInferResponse]:
        session = StreamSession(self._parts.service, self._parts.regions, self._classifiers.for_request,
                                checked_target, _trace_context(context))
        async for message in session.run(request_iterator):
            yield message

    # -- statistics, repository --------------------------------------------------

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext) -> Any:
        async def statistics() -> Any:
            name, version = checked_target(request.name, request.version) if request.name else ("", "")
            body = await self._parts.statistics.model_stats(name, version)
            return json_format.ParseDict(body, pb.ModelStatisticsResponse())
        return await self._answer(statistics, context)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext) -> Any:
        async def index() -> Any:
            rows = self._parts.manager.index(request.ready)
            return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**row) for row in rows])
        return await self._answer(index, context)

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: grpc.aio.ServicerContext) -> Any:
        async def load() -> Any:
            await self._parts.manager.load(request.model_name, _repository_parameters(request.parameters))
            return pb.RepositoryModelLoadResponse()
        return await self._answer(load, context)

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: grpc.aio.ServicerContext) -> Any:
        async def unload() -> Any:
            await self._parts.manager.unload(request.model_name, _repository_parameters(request.parameters))
            return pb.RepositoryModelUnloadResponse()
        return await self._answer(unload, context)

    # -- shared memory -----------------------------------------------------------

    async def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest,
                                       context: grpc.aio.ServicerContext) -> Any:
        async def status() -> Any:
            regions = self._parts.regions.status(request.name or None)
            answer = pb.SystemSharedMemoryStatusResponse()
            for region in regions:
                answer.regions[region["name"]].CopyFrom(
                    pb.SystemSharedMemoryStatusResponse.RegionStatus(**region))
            return answer
        return await self._answer(status, context)

    async def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest,
                                         context: grpc.aio.ServicerContext) -> Any:
        async def register() -> Any:
            self._parts.regions.register(request.name, request.key, request.offset, request.byte_size)
            return pb.SystemSharedMemoryRegisterResponse()
        return await self._answer(register, context)

    async def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest,
                                           context: grpc.aio.ServicerContext) -> Any:
        async def unregister() -> Any:
            if request.name:
                self._parts.regions.unregister(request.name)
            else:
                self._parts.regions.unregister_all()
            return pb.SystemSharedMemoryUnregisterResponse()
        return await self._answer(unregister, context)

    async def CudaSharedMemoryStatus(self, request: pb.CudaSharedMemoryStatusRequest,
                                     context: grpc.aio.ServicerContext) -> Any:
        async def status() -> Any:
            self._parts.regions.cuda_status(request.name or None)  # lists none, or refuses the name
            return pb.CudaSharedMemoryStatusResponse()
        return await self._answer(status, context)

    async def CudaSharedMemoryRegister(self, request: pb.CudaSharedMemoryRegisterRequest,
                                       context: grpc.aio.ServicerContext) -> Any:
        async def register() -> Any:
            self._parts.regions.cuda_register(request.name)
            return pb.CudaSharedMemoryRegisterResponse()
        return await self._answer(register, context)

    async def CudaSharedMemoryUnregister(self, request: pb.CudaSharedMemoryUnregisterRequest,
                                         context: grpc.aio.ServicerContext) -> Any:
        async def unregister() -> Any:
            self._parts.regions.cuda_unregister()
            return pb.CudaSharedMemoryUnregisterResponse()
        return await self._answer(unregister, context)

    # -- log and trace settings ----------------------------------------------------

    async def LogSettings(self, request: pb.LogSettingsRequest, context: grpc.aio.ServicerContext) -> Any:
        async def settings() -> Any:
            changes = {name: getattr(value, value.WhichOneof("parameter_choice"))
                       for name, value in request.settings.items() if value.WhichOneof("parameter_choice")}
            current = self._parts.logs.update(changes) if changes else self._parts.logs.settings()
            answer = pb.LogSettingsResponse()
            for name, value in current.items():
                slot = answer.settings[name]
                if isinstance(value, bool):
                    slot.bool_param = value
                elif isinstance(value, int):
                    slot.uint32_param = value
                else:
                    slot.string_param = value
            return answer
        return await self._answer(settings, context)

    async def TraceSetting(self, request: pb.TraceSettingRequest, context: grpc.aio.ServicerContext) -> Any:
        async def settings() -> Any:
            model = self._catalog.entry(request.model_name).name if request.model_name else ""
            changes = {name: _trace_value(name, list(value.value)) for name, value in request.settings.items()}
            traces = self._parts.traces
            try:
                current = traces.update(changes, model) if changes else traces.settings(model)
            except TraceSettingError as exc:
                raise InvalidRequest(str(exc)) from None
            answer = pb.TraceSettingResponse()
            for name, value in current.items():
                answer.settings[name].value.extend(value if isinstance(value, list) else [value])
            return answer
        return await self._answer(settings, context)

    # -- helpers -------------------------------------------------------------------

    async def _answer(self, call: Callable[[], Awaitable[Message]], context: grpc.aio.ServicerContext) -> Message:
        try:
            return await call()
        except Exception as exc:  # noqa: BLE001 - every error leaves as a status; abort_with logs bugs
            await abort_with(context, exc)
            raise  # not reached: abort raises


def _trace_context(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The W3C trace context a caller sent as gRPC metadata."""
    return {key: value for key, value in (context.invocation_metadata() or ())
            if key in _TRACE_KEYS and isinstance(value, str)}


def _repository_parameters(given: Any) -> dict[str, Any]:
    """``map<string, ModelRepositoryParameter>`` as the HTTP load body's parameters
    (a file's bytes as base64, which that body carries)."""
    plain: dict[str, Any] = {}
    for name, value in given.items():
        kind = value.WhichOneof("parameter_choice")
        if kind is None:
            raise InvalidRequest(f"repository parameter '{name}' has no value")
        content = getattr(value, kind)
        plain[name] = base64.b64encode(content).decode() if kind == "bytes_param" else content
    return plain


def _trace_value(name: str, values: list[str]) -> Any:
    """An empty list clears a setting (as Triton's clients send it); a level is a list; the rest one value."""
    if not values:
        return None
    if name == "trace_level":
        return values
    if len(values) != 1:
        raise InvalidRequest(f"trace setting '{name}' takes one value, got {len(values)}")
    return values[0]
