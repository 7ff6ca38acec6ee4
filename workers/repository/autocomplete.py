"""Completing a config from an ONNX model, as Triton's ONNX Runtime backend does.

``autocomplete`` works on parsed pbtxt values, before validation, so a
completed config goes through exactly the checks a hand-written one does. It
fills what is missing (inputs, outputs, their data_type and dims,
max_batch_size, platform, backend) and rejects a config that contradicts the
model. It is pure over an ``OnnxSignature``; ``read_signature`` asks
onnxruntime for one.

Batching: an explicit ``max_batch_size > 0`` needs every model tensor to have a
variable first dimension, which the config's dims then leave out. Without
``max_batch_size``, a model whose tensors all have a variable first dimension
gets ``max_batch_size: 4`` and a default ``dynamic_batching``; any other gets 0.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnxruntime as ort

from workers.datatypes import DATATYPES, from_config_name, to_config_name
from workers.errors import ConfigError, TensorError

DEFAULT_MAX_BATCH_SIZE = 4

ONNX_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16",
    "tensor(string)": "BYTES",
}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str  # V2 name, e.g. FP32
    shape: tuple[int, ...]  # -1 where the model leaves a dimension open


@dataclass(frozen=True, slots=True)
class OnnxSignature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


def read_signature(model_file: Path) -> OnnxSignature:
    """The model's inputs and outputs as onnxruntime reports them."""
    try:
        session = ort.InferenceSession(
            str(model_file), sess_options=_quiet_options(), providers=["CPUExecutionProvider"]
        )
    except Exception as err:  # onnxruntime has no exception root of its own to catch instead
        raise ConfigError(str(model_file), "(model)", f"onnxruntime cannot load the model: {err}") from None
    return OnnxSignature(
        inputs=tuple(_spec(model_file, "input", arg) for arg in session.get_inputs()),
        outputs=tuple(_spec(model_file, "output", arg) for arg in session.get_outputs()),
    )


def autocomplete_onnx(path: Path, parsed: dict[str, Any], model_file: Path) -> dict[str, Any]:
    return autocomplete(path, parsed, read_signature(model_file))


def autocomplete(path: Path, parsed: dict[str, Any], signature: OnnxSignature, platform: str = "onnxruntime_onnx",
                 backend: str = "onnxruntime") -> dict[str, Any]:
    """A completed copy of ``parsed``; ``path`` names the config in errors. The rules are the
    same for a TensorFlow SavedModel's signature (``workers.repository.savedmodel``)."""
    config = copy.deepcopy(parsed)
    config.setdefault("platform", platform)
    config.setdefault("backend", backend)
    batched = _complete_batching(path, config, signature)
    if batched is None:
        return config  # max_batch_size is malformed; validation names it
    implicit = _sequence_tensors(config)
    for kind, specs in (("input", signature.inputs), ("output", signature.outputs)):
        explicit = tuple(spec for spec in specs if spec.name not in implicit)
        config[kind] = _complete_tensors(path, kind, config.get(kind, []), explicit, batched)
    return config


def _sequence_tensors(config: dict[str, Any]) -> set[str]:
    """The graph tensors the sequence batcher feeds and reads (control inputs
    and implicit state), which Triton keeps out of ``input`` and ``output``."""
    batching = config.get("sequence_batching")
    if not isinstance(batching, dict):
        return set()
    names = {entry.get("name") for entry in _entries(batching.get("control_input"))}
    for state in _entries(batching.get("state")):
        names |= {state.get("input_name"), state.get("output_name")}
    return {name for name in names if isinstance(name, str)}


def _quiet_options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    return options


def _spec(model_file: Path, kind: str, arg: Any) -> TensorSpec:
    datatype = ONNX_TYPES.get(arg.type)
    if datatype is None:
        raise ConfigError(
            str(model_file), f"{kind} '{arg.name}'", f"ONNX type {arg.type} has no Triton datatype",
        )
    shape = tuple(dim if isinstance(dim, int) and dim >= 0 else -1 for dim in arg.shape or ())
    return TensorSpec(arg.name, datatype, shape)


def _complete_batching(path: Path, config: dict[str, Any], signature: OnnxSignature) -> bool | None:
    given = config.get("max_batch_size")
    if given is None:
        batched = _can_batch(config, signature)
        config["max_batch_size"] = DEFAULT_MAX_BATCH_SIZE if batched else 0
        if batched and "dynamic_batching" not in config and "sequence_batching" not in config:
            config["dynamic_batching"] = {}
        return batched
    if not isinstance(given, int) or isinstance(given, bool):
        return None
    if given > 0:
        _require_batch_dim(path, signature)
    return given > 0


def _can_batch(config: dict[str, Any], signature: OnnxSignature) -> bool:
    specs = signature.inputs + signature.outputs
    if not signature.inputs or not all(_has_batch_dim(spec) for spec in specs):
        return False
    by_name = {spec.name: spec for spec in specs}
    for entry in _entries(config.get("input")) + _entries(config.get("output")):
        name = entry.get("name")
        spec = by_name.get(name) if isinstance(name, str) else None
        dims = _compared_dims(entry)
        if spec is not None and isinstance(dims, list) and len(dims) == len(spec.shape):
            return False  # the config spells out the first dimension itself
    return True


def _require_batch_dim(path: Path, signature: OnnxSignature) -> None:
    for kind, specs in (("input", signature.inputs), ("output", signature.outputs)):
        for spec in specs:
            if not _has_batch_dim(spec):
                raise ConfigError(
                    str(path), "max_batch_size",
                    f"batching needs a variable first dimension, but the model's {kind} "
                    f"'{spec.name}' has shape {list(spec.shape)}",
                )


def _has_batch_dim(spec: TensorSpec) -> bool:
    return len(spec.shape) >= 1 and spec.shape[0] == -1


def _complete_tensors(
    path: Path, kind: str, listed: Any, specs: tuple[TensorSpec, ...], batched: bool
) -> Any:
    if not isinstance(listed, list):
        return listed
    by_name = {spec.name: spec for spec in specs}
    completed: list[Any] = []
    for index, entry in enumerate(listed):
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            spec = by_name.get(entry["name"])
            if spec is None:
                known = ", ".join(repr(s.name) for s in specs) or "none"
                raise ConfigError(
                    str(path), f"{kind}[{index}].name",
                    f"the model has no {kind} '{entry['name']}' (it has {known})",
                )
            entry = _complete_tensor(path, f"{kind}[{index}]", entry, spec, batched)
        completed.append(entry)
    named = {entry.get("name") for entry in _entries(listed) if isinstance(entry.get("name"), str)}
    completed += [_new_tensor(spec, batched) for spec in specs if spec.name not in named]
    return completed


def _new_tensor(spec: TensorSpec, batched: bool) -> dict[str, Any]:
    dims = list(_model_dims(spec, batched))
    return {"name": spec.name, "data_type": to_config_name(spec.datatype), "dims": dims}


def _complete_tensor(
    path: Path, field: str, entry: dict[str, Any], spec: TensorSpec, batched: bool
) -> dict[str, Any]:
    entry = dict(entry)
    if "data_type" not in entry:
        entry["data_type"] = to_config_name(spec.datatype)
    elif _v2_name(entry["data_type"]) not in (None, spec.datatype):
        raise ConfigError(
            str(path), f"{field}.data_type",
            f"the model's tensor '{spec.name}' is {to_config_name(spec.datatype)}, not {entry['data_type']}",
        )
    if "dims" not in entry and "reshape" not in entry:
        entry["dims"] = list(_model_dims(spec, batched))
    _check_dims(path, field, entry, spec, batched)
    return entry


def _check_dims(path: Path, field: str, entry: dict[str, Any], spec: TensorSpec, batched: bool) -> None:
    dims = _compared_dims(entry)
    if not isinstance(dims, list) or not all(isinstance(d, int) for d in dims):
        return  # missing or malformed; validation names it
    expected = _model_dims(spec, batched)
    if len(dims) == len(expected) and all(m in (-1, d) for m, d in zip(expected, dims)):
        return
    which = f"{field}.reshape.shape" if isinstance(entry.get("reshape"), dict) else f"{field}.dims"
    batch_note = " (without the batch dimension)" if batched else ""
    raise ConfigError(
        str(path), which,
        f"the model's tensor '{spec.name}' has dims {list(expected)}{batch_note}, but the config says {dims}",
    )


def _compared_dims(entry: dict[str, Any]) -> Any:
    """What the model sees: the reshape's shape when there is one, else dims."""
    reshape = entry.get("reshape")
    return reshape.get("shape") if isinstance(reshape, dict) else entry.get("dims")


def _model_dims(spec: TensorSpec, batched: bool) -> tuple[int, ...]:
    return spec.shape[1:] if batched else spec.shape


def _entries(listed: Any) -> list[dict[str, Any]]:
    return [entry for entry in listed if isinstance(entry, dict)] if isinstance(listed, list) else []


def _v2_name(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    if value in DATATYPES:
        return value
    try:
        return from_config_name(value)
    except TensorError:
        return None
