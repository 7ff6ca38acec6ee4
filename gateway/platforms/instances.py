"""Vertex AI's ``{"instances": [...]}`` as V2 infer requests, and their answers
as ``{"predictions": [...]}``, one prediction per instance.

An instance is one row of the model's inputs: for a model of one input its
value (or ``{"<input>": value}``), else an object with a value per input.
Rows go to the model in batches of at most ``max_batch_size`` (one each for a
model without batching). A BYTES value is a string, or ``{"b64": "..."}`` for
binary data, as Vertex writes it; they travel as binary tensor data, the rest
as V2 JSON ``data``, which the V2 parser checks as it checks any request. A
prediction is the row of the model's one output, or an object with a row per
output.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from gateway.errors import InvalidRequest
from workers.datatypes import join_bytes
from workers.repository.config import InputConfig, ModelConfig


@dataclass(frozen=True, slots=True)
class V2Request:
    body: bytes
    header_length: int | None  # binary tensor data after a JSON header of this length
    rows: int


def requests_for(config: ModelConfig, instances: Any, parameters: Any = None) -> list[V2Request]:
    """The V2 requests that carry ``instances`` to the model of ``config``."""
    if not isinstance(instances, list) or not instances:
        raise InvalidRequest("'instances' must be a non-empty array")
    if parameters is not None and not isinstance(parameters, dict):
        raise InvalidRequest("'parameters' must be an object")
    rows = [_row(config, index, instance) for index, instance in enumerate(instances)]
    size = config.max_batch_size or 1
    return [_request(config, rows[start:start + size], start, parameters) for start in range(0, len(rows), size)]


def predictions_from(config: ModelConfig, answers: list[dict[str, Any]], rows: list[int]) -> list[Any]:
    """One prediction per instance from the V2 JSON answers of ``requests_for``'s requests."""
    predictions: list[Any] = []
    for answer, count in zip(answers, rows):
        outputs = answer.get("outputs") or []
        per_output = {o["name"]: _rows(o, bool(config.max_batch_size)) for o in outputs}
        for index in range(count):
            if len(per_output) == 1:
                predictions.append(next(iter(per_output.values()))[index])
            else:
                predictions.append({name: values[index] for name, values in per_output.items()})
    return predictions


def _row(config: ModelConfig, index: int, instance: Any) -> dict[str, Any]:
    names = [tensor.name for tensor in config.inputs]
    if len(names) == 1 and not (isinstance(instance, dict) and set(instance) == {names[0]}):
        return {names[0]: instance}
    if not isinstance(instance, dict):
        raise InvalidRequest(f"instance {index}: the model takes {len(names)} inputs ({', '.join(names)}); "
                             "each instance must be an object with a value for each")
    unknown = sorted(set(instance) - set(names))
    if unknown:
        raise InvalidRequest(f"instance {index}: unknown input '{unknown[0]}'; the model takes {', '.join(names)}")
    missing = [t.name for t in config.inputs if t.name not in instance and not t.optional]
    if missing:
        raise InvalidRequest(f"instance {index}: no value for input '{missing[0]}'")
    return instance


def _request(config: ModelConfig, rows: list[dict[str, Any]], first: int, parameters: Any) -> V2Request:
    inputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for tensor in config.inputs:
        if not any(tensor.name in row for row in rows):
            continue
        values = [_value(tensor, first + i, row.get(tensor.name)) for i, row in enumerate(rows)]
        shape = _shape(tensor, first, values)
        batched = [len(values), *shape] if config.max_batch_size else shape
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": batched}
        if tensor.datatype == "BYTES":
            blob = join_bytes([item for value in values for item in _flat(value)])
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = [item for value in values for item in _flat(value)]
        inputs.append(entry)
    outputs = [{"name": o.name, "parameters": {"binary_data": False}} for o in config.outputs]
    header: dict[str, Any] = {"inputs": inputs, "outputs": outputs}
    if parameters:
        header["parameters"] = parameters
    body = orjson.dumps(header)
    if not blobs:
        return V2Request(body, None, len(rows))
    return V2Request(body + b"".join(blobs), len(body), len(rows))


def _value(tensor: InputConfig, index: int, value: Any) -> Any:
    if value is None:
        raise InvalidRequest(f"instance {index}: input '{tensor.name}' is missing or null "
                             "(an optional input must be given for every instance of a batch or for none)")
    if tensor.datatype == "BYTES":
        return _bytes(tensor.name, index, value)
    if isinstance(value, dict):
        raise InvalidRequest(f"instance {index}: input '{tensor.name}' is {tensor.datatype}; "
                             "an object ({\"b64\": ...}) is only for BYTES")
    return value


def _bytes(name: str, index: int, value: Any) -> Any:
    if isinstance(value, list):
        return [_bytes(name, index, item) for item in value]
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"instance {index}: input '{name}': 'b64' is not valid base64") from None
    raise InvalidRequest(f"instance {index}: input '{name}' is BYTES: expected strings or {{\"b64\": \"...\"}}")


def _shape(tensor: InputConfig, first: int, values: list[Any]) -> list[int]:
    shapes = [_shape_of(tensor.name, first + i, value) for i, value in enumerate(values)]
    for offset, shape in enumerate(shapes):
        if shape != shapes[0]:
            raise InvalidRequest(f"instance {first + offset}: input '{tensor.name}' has shape {shape}, but instance "
                                 f"{first} has {shapes[0]}: instances batched together must agree")
    shape = shapes[0]
    if not shape and list(tensor.dims) == [1]:
        shape = [1]  # a scalar for a [1] input, as Vertex clients send one
    return shape


def _shape_of(name: str, index: int, value: Any) -> list[int]:
    if not isinstance(value, list):
        return []
    if not value:
        return [0]
    inner = [_shape_of(name, index, item) for item in value]
    if any(shape != inner[0] for shape in inner):
        raise InvalidRequest(f"instance {index}: input '{name}' is not rectangular: its rows differ in shape")
    return [len(value), *inner[0]]


def _flat(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [item for part in value for item in _flat(part)]
    return [value]


def _rows(output: dict[str, Any], batched: bool) -> list[Any]:
    data, shape = output.get("data", []), output.get("shape", [])
    array = np.array(data, dtype=object).reshape(shape)
    if not batched:
        return [array.tolist()]  # a model without batching: the whole output is the one instance's
    return list(array.tolist())
