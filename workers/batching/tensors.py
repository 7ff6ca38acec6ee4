"""Merging requests into one batch along dimension 0, and splitting results back.

Pure functions over ``dict[str, np.ndarray]``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from workers.errors import ExecutionError

Tensors = Mapping[str, np.ndarray]


def batch_key(inputs: Tensors) -> Hashable:
    """Requests with equal keys can be concatenated along dimension 0."""
    return tuple(sorted((name, a.dtype.str, a.shape[1:]) for name, a in inputs.items()))


def rows_of(inputs: Tensors) -> int:
    """The batch dimension shared by every input (1 for a request with no inputs)."""
    return next(iter(inputs.values())).shape[0] if inputs else 1


def merge(requests: Sequence[Tensors]) -> dict[str, np.ndarray]:
    if len(requests) == 1:
        return dict(requests[0])
    names = requests[0].keys()
    return {name: np.concatenate([r[name] for r in requests], axis=0) for name in names}


def split(outputs: Tensors, rows: Sequence[int]) -> list[dict[str, np.ndarray]]:
    total = sum(rows)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise ExecutionError(
                f"output '{name}' has shape {list(array.shape)}, but the batch has "
                f"{total} rows; a batched model must keep dimension 0"
            )
    if len(rows) == 1:
        return [dict(outputs)]
    bounds = np.cumsum([0, *rows])
    return [
        {name: array[bounds[i]:bounds[i + 1]] for name, array in outputs.items()}
        for i in range(len(rows))
    ]
