"""KServe V2 (Open Inference Protocol) HTTP bodies, exactly as Triton speaks them.

A body is a JSON header, optionally followed by raw tensor bytes (the binary
tensor data extension); the ``Inference-Header-Content-Length`` header says
where the JSON ends. Parsing turns either form into ``WireTensor`` (an input
in shared memory into a ``RegionInput``, which ``gateway.shared_memory`` reads)
and raises only ``InvalidRequest``, whatever the bytes; it holds a request to the
envelope's ``Limits`` (tensor counts, dims, name lengths), so what passes
here a worker can decode. Rendering turns a ``Response``
back into JSON, binary blobs, or a mix. No I/O; a header without tensor data is read once and
remembered by its bytes (clients send the same one with every request).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from broker.envelope import DEFAULT_LIMITS, Limits, Response, WireTensor
from broker.quick_init import quick_init
from gateway.errors import InvalidRequest
from gateway.json_lift import load_lifted
from gateway.json_tensors import FLOATS, json_bytes, json_name
from gateway.shared_memory.refs import RegionInput, RegionSlice, region_input, region_slice
from workers.datatypes import DATATYPES, decode_array, element_count, numpy_dtype, split_bytes
from workers.errors import TensorError

Classify = Callable[[WireTensor, int], WireTensor]
_BINARY_OUTPUT = "binary_data_output"
_MAX_CLASSES = 2**32 - 1  # Triton reads it as an unsigned 32-bit count


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    name: str
    binary: bool
    region: RegionSlice | None = None  # its bytes go to this shared memory, not the response
    classification: int = 0  # > 0: the top K classes instead of the values (gateway.classification)


@quick_init
@dataclass(frozen=True, slots=True)
class ParsedInfer:
    id: str
    inputs: tuple[WireTensor | RegionInput, ...]  # a RegionInput is read by the HTTP infer route
    outputs: tuple[RequestedOutput, ...]
    parameters: dict[str, Any]
    binary_output_default: bool


@dataclass(frozen=True, slots=True)
class _BinaryInput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    size: int


@dataclass(frozen=True, slots=True)
class _ReadHeader:
    """A request's JSON header, read and checked: everything but the binary bytes after it."""

    id: str
    parts: tuple[WireTensor | _BinaryInput | RegionInput, ...]
    binary: tuple[_BinaryInput, ...]  # the parts whose bytes follow the header, in order
    outputs: tuple[RequestedOutput, ...]
    parameters: dict[str, Any]
    binary_default: bool

    @property
    def reusable(self) -> bool:
        """No input's data is in the JSON: the next request with the same header reads alike."""
        return not any(isinstance(part, WireTensor) for part in self.parts)

    def bind(self, blob: memoryview) -> ParsedInfer:
        """The request, its binary inputs views on ``blob`` (not copied)."""
        if sum(part.size for part in self.binary) != len(blob):
            raise _binary_total_error(self.binary, len(blob))
        inputs: tuple[WireTensor | RegionInput, ...]
        if self.binary:
            bound: list[WireTensor | RegionInput] = []
            offset = 0
            for part in self.parts:
                if isinstance(part, _BinaryInput):
                    part, offset = _bind_binary(part, blob, offset)
                bound.append(part)
            inputs = tuple(bound)
        else:
            inputs = self.parts  # type: ignore[assignment]  # no _BinaryInput among them
        return ParsedInfer(self.id, inputs, self.outputs, dict(self.parameters), self.binary_default)


class _Remembered:
    """The last ``size`` reusable headers read, by their bytes (the oldest forgotten first)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._read: dict[bytes, _ReadHeader] = {}

    def get(self, key: bytes) -> _ReadHeader | None:
        return self._read.get(key)

    def keep(self, key: bytes, read: _ReadHeader) -> None:
        if len(self._read) >= self._size:
            self._read.pop(next(iter(self._read)), None)
        self._read[key] = read


_REMEMBERED_BYTES = 4096  # a JSON header up to this long is remembered once read (when it holds no data)
_REMEMBERED = _Remembered(512)


def _read_header(header: dict[str, Any], limits: Limits) -> _ReadHeader:
    parameters = dict(_object(header.get("parameters"), "request field 'parameters'"))
    binary_default = _boolean(parameters.pop(_BINARY_OUTPUT, False), f"parameter '{_BINARY_OUTPUT}'")
    request_id = _request_id(header.get("id", ""))
    parts = _inputs(header.get("inputs"), limits)
    return _ReadHeader(
        id=request_id, parts=parts, binary=tuple(part for part in parts if isinstance(part, _BinaryInput)),
        outputs=_requested_outputs(header.get("outputs"), binary_default, limits),
        parameters=parameters, binary_default=binary_default,
    )


def parse_infer_request(body: bytes, header_length: int | None, limits: Limits = DEFAULT_LIMITS) -> ParsedInfer:
    json_part, blob = _split_body(body, header_length)
    if len(json_part) > _REMEMBERED_BYTES or limits is not DEFAULT_LIMITS:
        header = load_lifted(body, len(json_part)) or _load_header(json_part, framed=header_length is not None)
        return _read_header(header, limits).bind(blob)
    # A client sends the same JSON header again and again, its tensors' bytes after it: read once.
    key = bytes(json_part)
    read = _REMEMBERED.get(key)
    if read is None:
        read = _read_header(_load_header(json_part, framed=header_length is not None), limits)
        if read.reusable:
            _REMEMBERED.keep(key, read)
    return read.bind(blob)


def parse_infer_header(header: dict[str, Any], blob: memoryview, limits: Limits = DEFAULT_LIMITS) -> ParsedInfer:
    """A V2 request's JSON header, already parsed, with the binary tensor data after it
    (``gateway.grpc`` builds both from a gRPC request)."""
    return _read_header(header, limits).bind(blob)


def render_infer_response(response: Response, requested: tuple[RequestedOutput, ...],
                          binary_default: bool, classify: Classify | None = None) -> tuple[bytes, int | None]:
    """The body, and the length of its JSON header when binary outputs follow it (else None).
    ``classify(tensor, k)`` turns an output asked for with ``classification: K`` into its top K."""
    header, blobs = render_infer_parts(response, requested, binary_default, classify)
    if not blobs:
        return header, None
    return b"".join((header, *blobs)), len(header)


def render_infer_parts(response: Response, requested: tuple[RequestedOutput, ...], binary_default: bool,
                       classify: Classify | None = None) -> tuple[bytes, tuple[bytes | memoryview, ...]]:
    """The body's JSON header, and the binary outputs that follow it (not joined)."""
    entries: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for tensor, wanted in selected_outputs(response.outputs, requested, binary_default):
        if wanted.classification:
            if classify is None:
                raise InvalidRequest(f"requested output '{tensor.name}': classification is not available here")
            tensor = classify(tensor, wanted.classification)
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if wanted.region is not None:  # its bytes were written to the region
            entry["parameters"] = wanted.region.parameters()
        elif wanted.binary:
            entry["parameters"] = {"binary_data_size": len(tensor.data)}
            blobs.append(tensor.data)
        else:
            entry["data"] = _json_data(tensor)
        entries.append(entry)
    return _response_header(response, entries), tuple(blobs)


def render_error(message: str) -> bytes:
    return orjson.dumps({"error": message})


# -- request framing ---------------------------------------------------------

def _split_body(body: bytes, header_length: int | None) -> tuple[memoryview, memoryview]:
    view = memoryview(body)
    if header_length is None:
        return view, view[:0]
    if isinstance(header_length, bool) or not isinstance(header_length, int):
        raise InvalidRequest(f"Inference-Header-Content-Length {header_length!r} is not an integer")
    if header_length < 0:
        raise InvalidRequest(f"Inference-Header-Content-Length {header_length} is negative")
    if header_length > len(view):
        raise InvalidRequest(f"Inference-Header-Content-Length {header_length} is larger than "
                             f"the {len(view)}-byte request body")
    return view[:header_length], view[header_length:]


def _load_header(raw: memoryview, framed: bool) -> dict[str, Any]:
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"malformed JSON in request header: {exc}{_json_hint(raw, exc, framed)}") from None
    if not isinstance(header, dict):
        raise InvalidRequest(f"request header must be a JSON object, got {json_name(header)}")
    return header


def _json_hint(raw: memoryview, exc: orjson.JSONDecodeError, framed: bool) -> str:
    text = bytes(raw)
    if b"NaN" in text or b"Infinity" in text:
        return " (NaN and Infinity are not valid JSON: send such values as binary tensor data)"
    if not framed and "after document" in str(exc):
        return " (binary data follows the JSON: is the Inference-Header-Content-Length header missing?)"
    return ""


def _request_id(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"request field 'id' must be a string, got {json_name(value)}")
    return value


# -- inputs ------------------------------------------------------------------

def _inputs(raw: Any, limits: Limits) -> tuple[WireTensor | _BinaryInput | RegionInput, ...]:
    if not isinstance(raw, list):
        raise InvalidRequest("request field 'inputs' must be a list of tensors"
                             if raw is not None else "request field 'inputs' is missing")
    _check_count(raw, "inputs", limits.max_tensors)
    parts = tuple(_input(index, item, limits) for index, item in enumerate(raw))
    _check_unique([part.name for part in parts], "input")
    return parts


def _input(index: int, item: Any, limits: Limits) -> WireTensor | _BinaryInput | RegionInput:
    if not isinstance(item, dict):
        raise InvalidRequest(f"inputs[{index}] must be an object, got {json_name(item)}")
    name = _name(item, f"inputs[{index}]", limits)
    where = f"input '{name}'"
    datatype = _datatype(item, where)
    shape = _shape(item, where, limits)
    parameters = _object(item.get("parameters"), f"{where}: field 'parameters'")
    region = region_slice(parameters, where)
    size = parameters.get("binary_data_size")
    if region is not None:
        if "data" in item or size is not None:
            given = "data" if "data" in item else "parameters.binary_data_size"
            raise InvalidRequest(f"{where} has both '{given}' and 'parameters.shared_memory_region'")
        return region_input(name, datatype, shape, where, region)
    if size is not None:
        if "data" in item:
            raise InvalidRequest(f"{where} has both 'data' and 'parameters.binary_data_size'")
        return _binary_input(name, datatype, shape, size)
    if "data" not in item:
        raise InvalidRequest(f"{where} has neither 'data' nor 'parameters.binary_data_size'")
    return WireTensor(name, datatype, shape, json_bytes(name, datatype, shape, item["data"]))


def _name(item: dict[str, Any], where: str, limits: Limits) -> str:
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where}: field 'name' must be a non-empty string, got {json_name(name)}")
    if len(name) > limits.max_name_len:
        raise InvalidRequest(f"{where}: field 'name' is {len(name)} characters long, more than "
                             f"the {limits.max_name_len} allowed")
    return name


def _datatype(item: dict[str, Any], where: str) -> str:
    datatype = item.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidRequest(f"{where}: field 'datatype' must be a string, got {json_name(datatype)}")
    if datatype not in DATATYPES:
        raise InvalidRequest(f"{where}: unknown datatype '{datatype}'")
    return datatype


def _shape(item: dict[str, Any], where: str, limits: Limits) -> tuple[int, ...]:
    shape = item.get("shape")
    if not isinstance(shape, list):
        raise InvalidRequest(f"{where}: field 'shape' must be a list of integers, got {json_name(shape)}")
    if len(shape) > limits.max_dims:
        raise InvalidRequest(f"{where}: shape has {len(shape)} dimensions, more than "
                             f"the {limits.max_dims} allowed")
    for dim in shape:
        if type(dim) is not int:
            raise InvalidRequest(f"{where}: shape {shape} must hold integers, found {json_name(dim)}")
        if dim < 0:
            raise InvalidRequest(f"{where}: shape {shape} has a negative dimension")
        if dim > limits.max_dim_size:
            raise InvalidRequest(f"{where}: shape {shape} has a dimension above {limits.max_dim_size}")
    return tuple(shape)


def _binary_input(name: str, datatype: str, shape: tuple[int, ...], size: Any) -> _BinaryInput:
    where = f"input '{name}'"
    if type(size) is not int or size < 0:
        raise InvalidRequest(f"{where}: 'binary_data_size' must be a non-negative integer, got {size!r}")
    if datatype != "BYTES":
        expected = element_count(shape) * numpy_dtype(datatype).itemsize
        if size != expected:
            raise InvalidRequest(f"{where}: binary_data_size {size} does not match shape {list(shape)} "
                                 f"of {datatype} ({expected} bytes expected)")
    return _BinaryInput(name, datatype, shape, size)


def _binary_total_error(parts: tuple[_BinaryInput, ...], available: int) -> InvalidRequest:
    declared = sum(part.size for part in parts)
    named = ", ".join(f"'{part.name}'" for part in parts) or "none"
    hint = " (is the Inference-Header-Content-Length header missing?)" if declared > available == 0 else ""
    return InvalidRequest(f"binary_data_size of inputs ({named}) adds up to {declared} bytes, but "
                          f"{available} bytes follow the JSON header{hint}")


def _bind_binary(part: _BinaryInput, blob: memoryview, offset: int) -> tuple[WireTensor, int]:
    end = offset + part.size
    data = blob[offset:end]  # a view on the body: its bytes are not copied
    if part.datatype == "BYTES":
        try:
            split_bytes(part.name, data, element_count(part.shape))
        except TensorError as exc:
            raise InvalidRequest(f"input '{part.name}': {exc}") from None
    return WireTensor(part.name, part.datatype, part.shape, data), end


# -- requested outputs -------------------------------------------------------

def _requested_outputs(raw: Any, binary_default: bool, limits: Limits) -> tuple[RequestedOutput, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidRequest(f"request field 'outputs' must be a list, got {json_name(raw)}")
    _check_count(raw, "outputs", limits.max_tensors)
    outputs = tuple(_requested_output(index, item, binary_default, limits) for index, item in enumerate(raw))
    _check_unique([output.name for output in outputs], "output")
    return outputs


def _requested_output(index: int, item: Any, binary_default: bool, limits: Limits) -> RequestedOutput:
    if not isinstance(item, dict):
        raise InvalidRequest(f"outputs[{index}] must be an object, got {json_name(item)}")
    name = _name(item, f"outputs[{index}]", limits)
    where = f"requested output '{name}'"
    parameters = _object(item.get("parameters"), f"{where}: field 'parameters'")
    region = region_slice(parameters, where)
    classes = parameters.get("classification", 0)
    if isinstance(classes, bool) or not isinstance(classes, int) or not 0 <= classes <= _MAX_CLASSES:
        raise InvalidRequest(f"{where}: Unable to set 'classification': expected an integer from 0 to "
                             f"{_MAX_CLASSES}, got {orjson.dumps(classes).decode()[:40]}")
    if region is not None and classes:
        raise InvalidRequest(f"{where}: Output can't set both 'shared_memory_region' and 'classification'")
    binary = _boolean(parameters.get("binary_data", binary_default), f"{where}: parameter 'binary_data'")
    if region is not None and parameters.get("binary_data") is True:
        raise InvalidRequest(f"{where} can't set both 'shared_memory_region' and 'binary_data'")
    return RequestedOutput(name, binary and region is None, region, classes)


# -- response ----------------------------------------------------------------

def selected_outputs(outputs: tuple[WireTensor, ...], requested: tuple[RequestedOutput, ...],
                     binary_default: bool) -> Iterator[tuple[WireTensor, RequestedOutput]]:
    if not requested:
        return ((tensor, RequestedOutput(tensor.name, binary_default)) for tensor in outputs)
    by_name = {tensor.name: tensor for tensor in outputs}
    missing = [wanted.name for wanted in requested if wanted.name not in by_name]
    if missing:
        raise InvalidRequest(f"requested output '{missing[0]}' is not produced by the model "
                             f"(it produced {sorted(by_name)})")
    return ((by_name[wanted.name], wanted) for wanted in requested)


def _json_data(tensor: WireTensor) -> list[str] | np.ndarray:
    where = f"output '{tensor.name}'"
    if tensor.datatype == "BF16":
        raise InvalidRequest(f"{where} is BF16, which cannot be returned as JSON; "
                             f"request it with parameters.binary_data: true")
    if tensor.datatype == "BYTES":
        return _json_strings(tensor, where)
    array = decode_array(tensor.name, tensor.datatype, tensor.shape, tensor.data).reshape(-1)
    if tensor.datatype in FLOATS and not np.isfinite(array).all():
        raise InvalidRequest(f"{where} holds NaN or Infinity, which JSON cannot carry; "
                             f"request it with parameters.binary_data: true")
    # orjson writes a flat native-order array faster than tolist() (13 vs 26 us per 1000 FP32).
    return array


def _json_strings(tensor: WireTensor, where: str) -> list[str]:
    items = split_bytes(tensor.name, tensor.data, element_count(tensor.shape))
    try:
        return [item.decode("utf-8") for item in items]
    except UnicodeDecodeError:
        raise InvalidRequest(f"{where} holds bytes that are not valid UTF-8 and cannot be returned "
                             f"as JSON; request it with parameters.binary_data: true") from None


def _response_header(response: Response, entries: list[dict[str, Any]]) -> bytes:
    header: dict[str, Any] = {"model_name": response.model, "model_version": response.model_version}
    if response.id:  # as Triton does: no id in, no id out
        header["id"] = response.id
    if response.parameters:
        header["parameters"] = response.parameters
    header["outputs"] = entries
    return orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)


# -- shared helpers ----------------------------------------------------------

def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where} must be an object, got {json_name(value)}")
    return value


def _boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{where} must be true or false, got {json_name(value)}")
    return value


def _check_count(items: list[Any], field: str, limit: int) -> None:
    if len(items) > limit:
        raise InvalidRequest(f"request field '{field}' holds {len(items)} entries, more than the {limit} allowed")


def _check_unique(names: list[str], kind: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidRequest(f"{kind} '{name}' appears more than once")
        seen.add(name)
