"""Checking one request's tensors against its model's config, and turning
them into numpy arrays. Every error names the model and the tensor."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from broker.envelope import WireTensor
from workers.datatypes import decode_array
from workers.errors import InvalidInput, TensorError
from workers.repository.config import ModelConfig, TensorConfig


def prepare_inputs(config: ModelConfig, tensors: Sequence[WireTensor]) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for tensor in tensors:
        spec = config.input(tensor.name)
        if spec is None:
            raise InvalidInput(f"model '{config.name}' has no input '{tensor.name}' "
                               f"(inputs: {', '.join(i.name for i in config.inputs)})")
        if tensor.name in arrays:
            raise InvalidInput(f"input '{tensor.name}' is given more than once")
        _check_datatype(config, spec, tensor)
        _check_shape(config, spec, tensor.shape)
        arrays[tensor.name] = decode_array(tensor.name, tensor.datatype, tensor.shape, tensor.data)
    missing = [i.name for i in config.inputs if i.name not in arrays and not i.optional]
    if missing:
        raise InvalidInput(f"model '{config.name}' expects input '{missing[0]}', which the request lacks")
    _check_batch_rows(config, arrays)
    return arrays


def check_outputs(config: ModelConfig, names: Sequence[str]) -> None:
    for name in names:
        if config.output(name) is None:
            raise InvalidInput(f"model '{config.name}' has no output '{name}' "
                               f"(outputs: {', '.join(o.name for o in config.outputs)})")


def _check_datatype(config: ModelConfig, spec: TensorConfig, tensor: WireTensor) -> None:
    if tensor.datatype != spec.datatype:
        raise TensorError(f"input '{tensor.name}' of model '{config.name}' has datatype "
                          f"{tensor.datatype}, expected {spec.datatype}")


def _check_shape(config: ModelConfig, spec: TensorConfig, shape: tuple[int, ...]) -> None:
    fault = _shape_fault(config.name, config.max_batch_size, spec.name, spec.dims, shape)
    if fault is not None:
        raise TensorError(fault)


@functools.lru_cache(maxsize=4096)
def _shape_fault(model: str, max_batch_size: int, name: str, dims: tuple[int, ...],
                 shape: tuple[int, ...]) -> str | None:
    """What is wrong with ``shape`` for the input ``name`` (None: nothing); remembered, since
    a model's clients send the same few shapes again and again."""
    batched = max_batch_size > 0
    expected = [-1, *dims] if batched else list(dims)
    if batched and shape and not 1 <= shape[0] <= max_batch_size:
        return (f"input '{name}': batch size {shape[0]} is outside 1..{max_batch_size}, "
                f"the max_batch_size of model '{model}'")
    if len(shape) != len(expected) or any(d != -1 and d != s for d, s in zip(expected, shape)):
        return f"input '{name}': shape {list(shape)} does not match the model's {expected}"
    return None


def _check_batch_rows(config: ModelConfig, arrays: dict[str, np.ndarray]) -> None:
    if config.max_batch_size <= 0 or not arrays:
        return
    rows = {name: a.shape[0] for name, a in arrays.items()}
    if len(set(rows.values())) > 1:
        raise TensorError(f"inputs disagree on the batch size: {rows}")
