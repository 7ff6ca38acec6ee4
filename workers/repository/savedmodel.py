"""A TensorFlow SavedModel's signature, read from ``saved_model.pb`` without TensorFlow.

Reading a repository (the gateway does it too) must not import TensorFlow, so the few
fields autocomplete needs are decoded straight from protobuf's wire format: the
``MetaGraphDef`` tagged ``serve``, its ``signature_def`` map, and each input's and
output's ``TensorInfo`` (dtype and shape). Field numbers are those of TensorFlow's
``saved_model.proto``, ``meta_graph.proto``, ``types.proto`` and ``tensor_shape.proto``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from workers.errors import ConfigError
from workers.repository.autocomplete import OnnxSignature, TensorSpec

SAVED_MODEL_FILE = "saved_model.pb"
DEFAULT_SIGNATURE = "serving_default"
SERVE_TAG = "serve"
# TensorFlow's DataType enum -> V2 datatype.
TF_TYPES = {1: "FP32", 2: "FP64", 3: "INT32", 4: "UINT8", 5: "INT16", 6: "INT8", 7: "BYTES", 9: "INT64",
            10: "BOOL", 14: "BF16", 17: "UINT16", 19: "FP16", 22: "UINT32", 23: "UINT64"}

Fields = list[tuple[int, int | bytes]]


def read_savedmodel_signature(model_dir: Path, signature: str = DEFAULT_SIGNATURE) -> OnnxSignature:
    path = model_dir / SAVED_MODEL_FILE
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(str(path), "(model)", f"cannot read the SavedModel: {exc.strerror or exc}") from None
    try:
        return _signature(path, _fields(data), signature)
    except (ValueError, IndexError) as exc:
        raise ConfigError(str(path), "(model)", f"not a SavedModel protobuf: {exc}") from None


def _signature(path: Path, saved_model: Fields, wanted: str) -> OnnxSignature:
    graphs = [_fields(value) for number, value in saved_model if number == 2 and isinstance(value, bytes)]
    serving = [graph for graph in graphs if SERVE_TAG in _tags(graph)] or graphs
    if not serving:
        raise ConfigError(str(path), "(model)", "the SavedModel holds no meta graph")
    signatures = {name: body for name, body in _map(serving[0], 5) if not name.startswith("__")}  # not init ops
    if wanted not in signatures:
        known = ", ".join(sorted(repr(name) for name in signatures)) or "none"
        raise ConfigError(str(path), "parameters.TF_SIGNATURE_DEF",
                          f"the SavedModel has no signature '{wanted}' (it has {known})")
    signature = _fields(signatures[wanted])
    return OnnxSignature(inputs=_tensors(path, signature, 1), outputs=_tensors(path, signature, 2))


def _tags(graph: Fields) -> set[str]:
    info = next((_fields(value) for number, value in graph if number == 1 and isinstance(value, bytes)), [])
    return {value.decode() for number, value in info if number == 4 and isinstance(value, bytes)}


def _map(message: Fields, field: int) -> Iterator[tuple[str, bytes]]:
    """A ``map<string, message>`` field's entries: each entry is key (1) and value (2)."""
    for number, value in message:
        if number == field and isinstance(value, bytes):
            entry = dict(_fields(value))
            key, body = entry.get(1, b""), entry.get(2, b"")
            if isinstance(key, bytes) and isinstance(body, bytes):
                yield key.decode(), body


def _tensors(path: Path, signature: Fields, field: int) -> tuple[TensorSpec, ...]:
    specs = []
    for name, body in sorted(_map(signature, field)):
        info = _fields(body)
        dtype = next((value for number, value in info if number == 2 and isinstance(value, int)), 0)
        datatype = TF_TYPES.get(dtype)
        if datatype is None:
            kind = "input" if field == 1 else "output"
            raise ConfigError(str(path), f"{kind} '{name}'", f"TensorFlow dtype {dtype} has no Triton datatype")
        shape_message = next((_fields(v) for n, v in info if n == 3 and isinstance(v, bytes)), [])
        dims = []
        for number, value in shape_message:
            if number == 2 and isinstance(value, bytes):
                size = next((v for n, v in _fields(value) if n == 1 and isinstance(v, int)), 0)
                dims.append(_signed(size))
        specs.append(TensorSpec(name, datatype, tuple(d if d >= 0 else -1 for d in dims)))
    return tuple(specs)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _fields(data: bytes) -> Fields:
    """One message's fields in order: (number, int) for varints and fixed ones, (number, bytes) for
    length-delimited ones."""
    fields: Fields = []
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, at = _varint(data, at)
            fields.append((number, value))
        elif kind == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise ValueError("a field runs past the end of its message")
            fields.append((number, data[at:at + length]))
            at += length
        elif kind == 1:
            fields.append((number, int.from_bytes(data[at:at + 8], "little")))
            at += 8
        elif kind == 5:
            fields.append((number, int.from_bytes(data[at:at + 4], "little")))
            at += 4
        else:
            raise ValueError(f"wire type {kind} of field {number} is not one protobuf writes")
    return fields


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than ten bytes")
