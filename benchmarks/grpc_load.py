"""A closed-loop gRPC client for ``inference.GRPCInferenceService/ModelInfer``, as light as
``loadgen``'s HTTP one: the request serialized once, sent as bytes on a grpcio asyncio
channel (one channel per client, as each HTTP client has its own connection), and a reply
parsed only to check its ``raw_output_contents``."""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter

import grpc
from tritonclient.grpc import service_pb2 as pb

from benchmarks.loadgen import Client, LoadResult, TensorSpec, Window, record

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
# As large as Triton's clients allow, so a batch of images never meets grpcio's 4 MB default.
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)]


@dataclass(frozen=True, slots=True)
class GrpcTarget:
    address: str                    # host:port
    request: bytes                  # a serialized ModelInferRequest, sent as is
    expected_output_bytes: int      # bytes of the first raw output of a good reply


def model_infer_request(model: str, tensor: TensorSpec) -> bytes:
    """One ModelInferRequest with its input in ``raw_input_contents`` and every output asked for."""
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
    request.raw_input_contents.append(tensor.data)
    return request.SerializeToString()


def _problem(target: GrpcTarget, reply: bytes) -> str | None:
    response = pb.ModelInferResponse.FromString(reply)
    if not response.raw_output_contents:
        return "reply has no raw_output_contents"
    size = len(response.raw_output_contents[0])
    return None if size == target.expected_output_bytes else f"{size} output bytes, " \
        f"expected {target.expected_output_bytes}"


async def probe(target: GrpcTarget) -> pb.ModelInferResponse:
    async with grpc.aio.insecure_channel(target.address, options=CHANNEL_OPTIONS) as channel:
        reply = await channel.unary_unary(MODEL_INFER)(target.request)
    problem = _problem(target, reply)
    if problem is not None:
        raise RuntimeError(problem)
    return pb.ModelInferResponse.FromString(reply)


def client(target: GrpcTarget) -> Client:
    """A ``loadgen.Client`` sending ``target.request`` until the window ends."""
    async def run(window: Window, result: LoadResult) -> None:
        async with grpc.aio.insecure_channel(target.address, options=CHANNEL_OPTIONS) as channel:
            infer = channel.unary_unary(MODEL_INFER)
            while (start := perf_counter()) < window.end:
                try:
                    reply = await infer(target.request)
                except grpc.aio.AioRpcError as exc:
                    result.fail(f"{exc.code().name}: {exc.details()}")
                    continue
                record(result, window, start, lambda: _problem(target, reply))
    return run
