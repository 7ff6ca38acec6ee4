"""The control tensors Triton's sequence batcher feeds a model. Pure.

Each row of a batch gets START, END and READY flags (as the false/true values
its config names) and CORRID, the sequence id in the configured datatype.
A padding row (direct strategy) has every flag false and CORRID 0 or empty.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workers.datatypes import numpy_dtype
from workers.errors import SequenceError
from workers.sequences.config import Control, SequenceBatching

SequenceId = int | str

_FLAGS = {
    "CONTROL_SEQUENCE_START": "start",
    "CONTROL_SEQUENCE_END": "end",
    "CONTROL_SEQUENCE_READY": "ready",
}


@dataclass(frozen=True, slots=True)
class RowControl:
    sequence_id: SequenceId | None  # None: a padding row
    start: bool = False
    end: bool = False

    @property
    def ready(self) -> bool:
        return self.sequence_id is not None


def control_tensors(batching: SequenceBatching, rows: list[RowControl], batched: bool) -> dict[str, np.ndarray]:
    """``[rows, 1]`` tensors for a batching model, ``[1]`` for one without."""
    tensors: dict[str, np.ndarray] = {}
    for kind, (name, control) in batching.controls().items():
        if kind == "CONTROL_SEQUENCE_CORRID":
            values = np.array([corrid_value(control, row.sequence_id) for row in rows],
                              dtype=numpy_dtype(control.data_type))
        else:
            flag = _FLAGS[kind]
            values = np.array([_flag(control, getattr(row, flag)) for row in rows],
                              dtype=_flag_dtype(control))
        tensors[name] = values.reshape(-1, 1) if batched else values.reshape(1)
    return tensors


def corrid_value(control: Control, sequence_id: SequenceId | None) -> object:
    if control.data_type == "BYTES":
        return b"" if sequence_id is None else str(sequence_id).encode()
    if sequence_id is None:
        return 0
    if not isinstance(sequence_id, int):
        raise SequenceError(f"sequence_id '{sequence_id}' is a string, but the model's CORRID control "
                            f"is {control.data_type}; send an integer sequence_id")
    info = np.iinfo(numpy_dtype(control.data_type))
    if not info.min <= sequence_id <= info.max:
        raise SequenceError(f"sequence_id {sequence_id} does not fit the model's CORRID type {control.data_type}")
    return sequence_id


def check_sequence_id(batching: SequenceBatching, sequence_id: SequenceId) -> None:
    """Raise SequenceError if ``sequence_id`` cannot become the model's CORRID."""
    corrid = batching.controls().get("CONTROL_SEQUENCE_CORRID")
    if corrid is not None:
        corrid_value(corrid[1], sequence_id)


def _flag(control: Control, value: bool) -> object:
    pair = control.false_true()
    assert pair is not None, "validated by sequences.config.check"
    return pair[1][1] if value else pair[1][0]


def _flag_dtype(control: Control) -> np.dtype:
    pair = control.false_true()
    assert pair is not None, "validated by sequences.config.check"
    return numpy_dtype(pair[0])
