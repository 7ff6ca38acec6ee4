"""Implicit state: its initial value, and the store that checkpoints it.

A sequence's state is ``{input name: array}`` holding what its last step
wrote to each state output. The batcher keeps it in memory; a
``StateStore`` may also checkpoint it after every step, so that another
worker can resume the sequence if this one dies. A checkpoint also carries
the id and outputs of the step that produced it: a step delivered again
after a crash (its reply not yet acked) is answered from the checkpoint
instead of being applied to the state twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from workers.datatypes import decode_array, encode_array, numpy_dtype
from workers.errors import ConfigError
from workers.repository.safe_paths import inside
from workers.sequences.config import SequenceBatching, State

Tensors = dict[str, np.ndarray]
SequenceId = int | str


@dataclass(frozen=True, slots=True)
class Checkpoint:
    state: Tensors
    last_request: str = ""
    last_outputs: Tensors | None = None


class Lost:
    """What ``StateStore.load`` returns for a sequence known to have existed
    whose state is gone (its worker died and checkpointing is off)."""


LOST = Lost()


class StateStore(Protocol):
    async def load(self, sequence_id: SequenceId) -> Checkpoint | Lost | None:
        """The checkpoint of an active sequence this worker does not hold;
        LOST if it existed without one; None if it is unknown."""

    async def begin(self, sequence_id: SequenceId) -> None:
        """A sequence starts here."""

    async def save(self, checkpoints: list[tuple[SequenceId, Checkpoint]]) -> None:
        """Called after every batch with each step's new checkpoint, before any
        is answered; a store that does not checkpoint may ignore it."""

    async def drop(self, sequence_id: SequenceId) -> None:
        """The sequence ended or timed out."""


class LocalStates:
    """No checkpoints: a sequence lives and dies with this worker's memory,
    which already holds every sequence it knows."""

    async def load(self, sequence_id: SequenceId) -> Checkpoint | Lost | None:
        return None

    async def begin(self, sequence_id: SequenceId) -> None:
        return None

    async def save(self, checkpoints: list[tuple[SequenceId, Checkpoint]]) -> None:
        return None

    async def drop(self, sequence_id: SequenceId) -> None:
        return None


def initial_states(batching: SequenceBatching, model_dir: Path, batched: bool) -> Tensors:
    """Each state input's value at a sequence's START (with a batch dim of 1
    when the model batches). Without ``initial_state`` it is zeros."""
    states: Tensors = {}
    for index, state in enumerate(batching.state):
        value = _initial(state, model_dir, f"sequence_batching.state[{index}]")
        states[state.input_name] = value[np.newaxis] if batched else value
    return states


def _initial(state: State, model_dir: Path, where: str) -> np.ndarray:
    if not state.initial_state:
        dims = tuple(1 if d == -1 else d for d in state.dims)
        return _zeros(state.data_type, dims)
    initial = state.initial_state[0]
    if initial.zero_data:
        return _zeros(state.data_type, initial.dims)
    try:
        # A config may come with a load request: its data_file must stay inside initial_state/.
        path = inside(model_dir / "initial_state", initial.data_file)
    except ValueError as exc:
        raise ConfigError(str(model_dir), f"{where}.initial_state[0].data_file", str(exc)) from None
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(str(path), f"{where}.initial_state[0].data_file", f"cannot read it: {exc.strerror}") from None
    try:
        return decode_array(state.input_name, state.data_type, tuple(initial.dims), data)
    except Exception as exc:
        raise ConfigError(str(path), f"{where}.initial_state[0].data_file", str(exc)) from None


def _zeros(datatype: str, dims: tuple[int, ...]) -> np.ndarray:
    if datatype == "BYTES":
        empty = np.empty(dims, dtype=object)
        empty.fill(b"")
        return empty
    return np.zeros(dims, dtype=numpy_dtype(datatype))


def pack_tensors(tensors: Tensors) -> list[list[object]]:
    """Tensors as msgpack-ready ``[name, datatype, shape, bytes]`` lists."""
    packed: list[list[object]] = []
    for name, array in tensors.items():
        datatype, data = encode_array(np.ascontiguousarray(array))
        packed.append([name, datatype, list(array.shape), data])
    return packed


def unpack_tensors(packed: list[list[object]]) -> Tensors:
    tensors: Tensors = {}
    for name, datatype, shape, data in packed:
        assert isinstance(name, str) and isinstance(datatype, str) and isinstance(shape, list)
        assert isinstance(data, bytes)
        tensors[name] = decode_array(name, datatype, tuple(int(d) for d in shape), data)
    return tensors
