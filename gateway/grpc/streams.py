"""``ModelStreamInfer``: Triton's bidirectional stream of infer requests and responses.

Requests are published in the order they arrive, so the steps of a sequence
keep their order; each one's responses are sent as they come, with its
``id``. A decoupled model answers 0..N times: every response carries
``triton_final_response`` (true on the last), and the final empty one that
ends the stream is sent only when the request asked for it with
``triton_enable_empty_final_response``, as Triton does. A request that fails
gets an ``error_message`` on the stream, which stays open for the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import grpc
import structlog
from tritonclient.grpc import service_pb2 as pb

from broker.envelope import Response
from gateway.grpc.tensors import infer_response, parse_grpc_request
from gateway.service import InferenceService
from gateway.shared_memory.binding import BoundRequest, bind
from gateway.shared_memory.regions import SharedMemoryRegions
from gateway.status import ANSWERED
from gateway.v2_codec import Classify, RequestedOutput
from workers.responder import FINAL_FLAG

log = structlog.get_logger("ferry.gateway.grpc")

EMPTY_FINAL = "triton_enable_empty_final_response"
Classifiers = Callable[[str, tuple[RequestedOutput, ...]], Classify | None]
Target = Callable[[str, str], tuple[str, str]]


class StreamSession:
    """One call of ``ModelStreamInfer``: read requests, publish each, send every reply."""

    def __init__(self, service: InferenceService, regions: SharedMemoryRegions, classifiers: Classifiers,
                 target: Target, trace: dict[str, str]) -> None:
        self._service = service
        self._regions = regions
        self._classifiers = classifiers
        self._target = target
        self._trace = trace
        self._out: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        self._pumps: set[asyncio.Task[None]] = set()

    async def run(self, requests: AsyncIterator[pb.ModelInferRequest]) -> AsyncIterator[pb.ModelStreamInferResponse]:
        reader = asyncio.create_task(self._read(requests))
        try:
            while True:
                message = await self._out.get()
                if message is None:
                    return
                yield message
        finally:
            reader.cancel()
            for pump in list(self._pumps):
                pump.cancel()
            await asyncio.gather(reader, *self._pumps, return_exceptions=True)

    async def _read(self, requests: AsyncIterator[pb.ModelInferRequest]) -> None:
        try:
            async for request in requests:
                await self._start(request)
            await asyncio.gather(*self._pumps, return_exceptions=True)
        except grpc.aio.AioRpcError as exc:  # the client went away
            log.debug("grpc.stream_closed", error=str(exc))
        finally:
            self._out.put_nowait(None)

    async def _start(self, request: pb.ModelInferRequest) -> None:
        try:
            name, version = self._target(request.model_name, request.model_version)
            self._service.catalog.version(name, version)
            parsed = parse_grpc_request(request)
            empty_final = parsed.parameters.pop(EMPTY_FINAL, False) is True
            bound = bind(self._regions, parsed)
            replies = await self._service.stream(name, version, bound.parsed, self._trace)
        except ANSWERED as exc:  # this request fails; the stream goes on
            self._out.put_nowait(pb.ModelStreamInferResponse(error_message=str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - a bug fails this request, never the others
            log.exception("grpc.stream_request_failed", error=str(exc))
            self._out.put_nowait(pb.ModelStreamInferResponse(error_message=f"internal error: {type(exc).__name__}: {exc}"))
            return
        pump = asyncio.create_task(self._pump(name, request.id, replies, bound, empty_final))
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)

    async def _pump(self, model: str, request_id: str, replies: AsyncIterator[Response], bound: BoundRequest,
                    empty_final: bool) -> None:
        parsed = bound.parsed
        try:
            async for reply in replies:
                if reply.error is not None:
                    self._out.put_nowait(pb.ModelStreamInferResponse(error_message=reply.error.message))
                    continue
                final = bool(reply.parameters.get(FINAL_FLAG, reply.final))
                if final and not reply.outputs and not empty_final and FINAL_FLAG in reply.parameters:
                    continue  # a decoupled model's end of stream, not asked for
                bound.write_outputs(reply)
                reply = replace(reply, id=request_id, parameters={**reply.parameters, FINAL_FLAG: final})
                answer = infer_response(reply, parsed, self._classifiers(model, parsed.outputs))
                self._out.put_nowait(pb.ModelStreamInferResponse(infer_response=answer))
        except ANSWERED as exc:
            self._out.put_nowait(pb.ModelStreamInferResponse(error_message=str(exc)))
