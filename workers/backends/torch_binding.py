"""Binding a model's named tensors to a PyTorch module's arguments and results.

Inputs bind by Triton's positional convention when every name ends in
``__<index>`` (``INPUT__0`` is forward's first argument), else by name to
forward's parameter names. Results may be one tensor, a tuple or list
(positions from ``OUTPUT__<index>``, else the config's order), or a dict
keyed by output name. Arrays cross as numpy; BF16 travels as ml_dtypes'
bfloat16, which torch cannot take directly, so it goes through its bits.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch

from workers.errors import ExecutionError, ModelLoadError

_POSITIONAL = re.compile(r".+__([0-9]+)")
_BF16 = np.dtype(ml_dtypes.bfloat16)


def positions(names: Sequence[str]) -> dict[str, int] | None:
    """``{name: index}`` when every name follows the ``__<index>`` convention."""
    found = {name: _POSITIONAL.fullmatch(name) for name in names}
    if not names or not all(found.values()):
        return None
    return {name: int(match.group(1)) for name, match in found.items() if match}


def input_order(path: Path, names: Sequence[str], forward_args: Sequence[str]) -> tuple[str, ...]:
    """The input names in the order forward takes them."""
    by_position = positions(names)
    if by_position is not None:
        indices = sorted(by_position.values())
        if indices != list(range(len(names))):
            raise ModelLoadError(f"{path}: inputs named <name>__<index> must number 0..{len(names) - 1} "
                                 f"once each; got {sorted(by_position.items(), key=lambda kv: kv[1])}")
        return tuple(sorted(names, key=by_position.__getitem__))
    unknown = [name for name in names if name not in forward_args]
    unbound = [arg for arg in forward_args if arg not in names]
    if unknown or unbound:
        raise ModelLoadError(
            f"{path}: cannot bind inputs {list(names)} to forward({', '.join(forward_args)}): "
            f"name each input after a forward argument, or use Triton's INPUT__0, INPUT__1... convention")
    return tuple(forward_args)


def outputs_by_name(model: str, result: Any, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """The module's result as ``{output name: tensor}``."""
    if isinstance(result, dict):
        missing = [name for name in names if name not in result]
        if missing:
            raise ExecutionError(f"model '{model}' returned no '{missing[0]}' (keys: {sorted(map(str, result))})")
        return {name: _tensor(model, name, result[name]) for name in names}
    items = [result] if isinstance(result, torch.Tensor) else result
    if not isinstance(items, (tuple, list)):
        raise ExecutionError(f"model '{model}' returned {type(result).__name__}, not a tensor, tuple or dict")
    index = positions(names) or {name: i for i, name in enumerate(names)}
    if max(index.values(), default=-1) >= len(items):
        raise ExecutionError(f"model '{model}' returned {len(items)} value(s), too few for outputs {list(names)}")
    return {name: _tensor(model, name, items[index[name]]) for name in names}


def _tensor(model: str, name: str, value: Any) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ExecutionError(f"model '{model}': output '{name}' is {type(value).__name__}, not a tensor")
    return value


def to_torch(array: np.ndarray, device: torch.device, non_blocking: bool = False) -> torch.Tensor:
    """``non_blocking`` suits pinned host memory on a CUDA stream that is synchronised
    before the memory is reused."""
    if not array.flags.writeable:
        # torch warns on (and may not honour) read-only memory, as wire buffers are.
        array = array.copy()
    array = np.ascontiguousarray(array)
    if array.dtype == _BF16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16).to(device, non_blocking=non_blocking)
    return torch.from_numpy(array).to(device, non_blocking=non_blocking)


def to_host(tensor: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """A contiguous CPU copy; a non-blocking copy from CUDA lands in pinned memory and
    may be read only once its stream is synchronised."""
    return tensor.detach().contiguous().to("cpu", non_blocking=non_blocking)


def host_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor's memory as numpy, BF16 as ml_dtypes' bfloat16."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(_BF16)
    return tensor.numpy()


def pinned_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Page-locked host memory as a numpy array of any fixed-size dtype (needs CUDA).
    The array keeps the torch tensor that owns the memory alive."""
    count = 1
    for dim in shape:
        count *= dim
    raw = torch.empty(count * dtype.itemsize, dtype=torch.uint8, pin_memory=True)
    return raw.numpy().view(dtype).reshape(shape)
