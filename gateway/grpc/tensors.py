"""Triton's gRPC infer messages to and from what the HTTP door already speaks.

A ``ModelInferRequest`` becomes a V2 JSON header and the binary tensor data
after it, which ``gateway.v2_codec`` parses with every check the HTTP path
makes (tensor counts, names, shapes, sizes, shared memory, classification).
Its tensors come as ``raw_input_contents`` (one buffer per input not in shared
memory, in order: little-endian, BYTES as 4-byte-length-prefixed elements,
exactly the binary extension's layout) or as typed ``contents``
(``fp32_contents``...; FP16 and BF16 only raw, as in Triton). A response
goes back with every output's bytes in ``raw_output_contents``, as Triton
answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2 as pb

from broker.envelope import ParamValue, Response
from gateway.errors import InvalidRequest
from gateway.v2_codec import Classify, ParsedInfer, parse_infer_header, selected_outputs
from workers.datatypes import DATATYPES, join_bytes, numpy_dtype

_REGION = "shared_memory_region"
# The typed field of InferTensorContents that carries each datatype (FP16 and BF16 have none).
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def parse_grpc_request(request: pb.ModelInferRequest) -> ParsedInfer:
    inputs, blob = _inputs(request)
    header = {
        "id": request.id,
        "parameters": parameters(request.parameters),
        "inputs": inputs,
        "outputs": [_requested_output(o) for o in request.outputs],
    }
    return parse_infer_header(header, memoryview(blob))


def _requested_output(output: pb.ModelInferRequest.InferRequestedOutputTensor) -> dict[str, Any]:
    """An output's bytes come back raw unless it names a region to be written to."""
    given = parameters(output.parameters)
    return {"name": output.name, "parameters": given if _REGION in given else {**given, "binary_data": True}}


def _inputs(request: pb.ModelInferRequest) -> tuple[list[dict[str, Any]], bytes]:
    raw = request.raw_input_contents
    unshared = [t for t in request.inputs if _REGION not in t.parameters]
    if raw and len(raw) != len(unshared):
        raise InvalidRequest(f"expected {len(unshared)} buffers in raw_input_contents, one per input not in "
                             f"shared memory, got {len(raw)}")
    entries: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    buffers = iter(raw)
    for tensor in request.inputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape),
                                 "parameters": parameters(tensor.parameters)}
        if _REGION not in tensor.parameters:
            data = next(buffers) if raw else _typed_bytes(tensor)
            entry["parameters"]["binary_data_size"] = len(data)
            blobs.append(data)
        elif _has_contents(tensor):
            raise InvalidRequest(f"input '{tensor.name}' has both contents and parameter '{_REGION}'")
        entries.append(entry)
    return entries, b"".join(blobs)


def _has_contents(tensor: pb.ModelInferRequest.InferInputTensor) -> bool:
    return any(len(getattr(tensor.contents, field)) for field in set(CONTENTS_FIELD.values()))


def _typed_bytes(tensor: pb.ModelInferRequest.InferInputTensor) -> bytes:
    """An input's typed ``contents`` as the bytes the binary extension would carry."""
    where = f"input '{tensor.name}'"
    if tensor.datatype not in DATATYPES:
        raise InvalidRequest(f"{where}: unknown datatype '{tensor.datatype}'")
    field = CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        raise InvalidRequest(f"{where}: {tensor.datatype} tensors must be sent in raw_input_contents")
    given = [name for name in set(CONTENTS_FIELD.values()) if name != field and len(getattr(tensor.contents, name))]
    if given:
        raise InvalidRequest(f"{where}: a {tensor.datatype} tensor's values go in '{field}', not '{given[0]}'")
    values = getattr(tensor.contents, field)
    if tensor.datatype == "BYTES":
        return join_bytes(list(values))
    dtype = numpy_dtype(tensor.datatype)
    if dtype.kind in "iu":
        wide = np.array(values, dtype=np.uint64 if dtype == np.uint64 else np.int64)
        limits = np.iinfo(dtype)
        if wide.size and (wide.min() < limits.min or wide.max() > limits.max):
            raise InvalidRequest(f"{where}: a value in '{field}' is outside the range of {tensor.datatype}")
        return wide.astype(dtype).tobytes()
    return np.array(values, dtype=dtype).tobytes()


def parameters(given: Mapping[str, Any]) -> dict[str, ParamValue]:
    """``map<string, InferParameter>`` as plain values."""
    return {name: _parameter(name, value) for name, value in given.items()}


def _parameter(name: str, value: Message) -> ParamValue:
    kind = value.WhichOneof("parameter_choice")
    if kind is None:
        raise InvalidRequest(f"parameter '{name}' has no value")
    result: ParamValue = getattr(value, kind)
    return result


def infer_response(response: Response, parsed: ParsedInfer, classify: Classify | None) -> pb.ModelInferResponse:
    """Every requested output (all, when none was named) with its bytes in ``raw_output_contents``;
    an output written to shared memory names its region and has an empty buffer."""
    answer = pb.ModelInferResponse(model_name=response.model, model_version=response.model_version, id=parsed.id)
    _set_parameters(answer.parameters, response.parameters)
    for tensor, wanted in selected_outputs(response.outputs, parsed.outputs, True):
        if wanted.classification:
            assert classify is not None, "a classification was asked for without a classifier"
            tensor = classify(tensor, wanted.classification)
        output = answer.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        if wanted.region is not None:
            _set_parameters(output.parameters, wanted.region.parameters())
            answer.raw_output_contents.append(b"")
        else:
            answer.raw_output_contents.append(bytes(tensor.data))
    return answer


def _set_parameters(target: Any, values: Mapping[str, Any]) -> None:
    """Plain values into a ``map<string, InferParameter>``."""
    for name, value in values.items():
        if isinstance(value, bool):
            target[name].bool_param = value
        elif isinstance(value, int):
            target[name].int64_param = value
        elif isinstance(value, float):
            target[name].double_param = value
        elif isinstance(value, str):
            target[name].string_param = value
