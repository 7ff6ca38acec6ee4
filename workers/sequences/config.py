"""``sequence_batching``: Triton's SequenceBatching message as frozen pydantic models.

Control inputs (START, END, READY, CORRID) are tensors the batcher adds to
each step; ``state`` pairs a model input with the output that feeds it on the
sequence's next step. ``ModelConfig`` validates these; ``check`` adds the
cross-field rules pydantic cannot see (one control per kind, a false/true
pair of the right type, state names that clash with no declared tensor).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

from workers.datatypes import DATATYPES, from_config_name
from workers.errors import ConfigError, TensorError

NonNegInt = Annotated[int, Strict(), Field(ge=0)]
PositiveInt = Annotated[int, Strict(), Field(ge=1)]
Name = Annotated[str, Strict(), Field(min_length=1)]

ControlKind = Literal[
    "CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_CORRID",
]
FLAG_KINDS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY")
DEFAULT_IDLE_US = 1_000_000  # Triton's default when max_sequence_idle_microseconds is 0


def _datatype(value: Any) -> Any:
    if not isinstance(value, str) or value in DATATYPES:
        return value
    try:
        return from_config_name(value)
    except TensorError as err:
        raise ValueError(str(err)) from None


Datatype = Annotated[str, BeforeValidator(_datatype)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)


class Control(_Model):
    kind: ControlKind = "CONTROL_SEQUENCE_START"  # the schema's zero value, which protobuf never writes out
    int32_false_true: tuple[Annotated[int, Strict()], ...] = ()
    fp32_false_true: tuple[float, ...] = ()
    bool_false_true: tuple[Annotated[bool, Strict()], ...] = ()
    data_type: Datatype = ""

    def false_true(self) -> tuple[str, tuple[Any, Any]] | None:
        """(datatype, (false value, true value)) for a flag control."""
        for datatype, pair in (("INT32", self.int32_false_true), ("FP32", self.fp32_false_true),
                               ("BOOL", self.bool_false_true)):
            if pair:
                return datatype, (pair[0], pair[1])
        return None


class ControlInput(_Model):
    name: Name
    control: tuple[Control, ...] = Field(min_length=1)


class InitialState(_Model):
    data_type: Datatype
    dims: tuple[Annotated[int, Strict()], ...] = ()
    zero_data: Annotated[bool, Strict()] = False
    data_file: str = ""
    name: str = ""


class State(_Model):
    input_name: Name
    output_name: Name
    data_type: Datatype
    dims: tuple[Annotated[int, Strict()], ...] = ()
    initial_state: tuple[InitialState, ...] = ()


class StrategyDirect(_Model):
    max_queue_delay_microseconds: NonNegInt = 0
    minimum_slot_utilization: float = 0.0


class StrategyOldest(_Model):
    max_candidate_sequences: NonNegInt = 0
    preferred_batch_size: tuple[PositiveInt, ...] = ()
    max_queue_delay_microseconds: NonNegInt = 0
    preserve_ordering: Annotated[bool, Strict()] = False


class SequenceBatching(_Model):
    direct: StrategyDirect | None = None
    oldest: StrategyOldest | None = None
    max_sequence_idle_microseconds: NonNegInt = 0
    control_input: tuple[ControlInput, ...] = ()
    state: tuple[State, ...] = ()

    @property
    def strategy(self) -> Literal["direct", "oldest"]:
        return "oldest" if self.oldest is not None else "direct"

    @property
    def idle_s(self) -> float:
        return (self.max_sequence_idle_microseconds or DEFAULT_IDLE_US) / 1e6

    @property
    def queue_delay_s(self) -> float:
        strategy = self.oldest if self.oldest is not None else self.direct
        return strategy.max_queue_delay_microseconds / 1e6 if strategy is not None else 0.0

    def controls(self) -> dict[str, tuple[str, Control]]:
        """Each control kind -> (the input it feeds, its Control)."""
        return {control.kind: (entry.name, control) for entry in self.control_input for control in entry.control}


def check(path: Path, batching: SequenceBatching, max_batch_size: int, tensors: set[str]) -> None:
    """Rules across fields; ``tensors`` are the declared input and output names."""
    field = "sequence_batching"
    if batching.direct is not None and batching.oldest is not None:
        raise ConfigError(str(path), field, "set only one strategy: direct or oldest")
    if batching.oldest is not None:
        for size in batching.oldest.preferred_batch_size:
            if size > max(1, max_batch_size):
                raise ConfigError(str(path), f"{field}.oldest.preferred_batch_size",
                                  f"preferred batch size {size} exceeds max_batch_size {max_batch_size}")
    _check_controls(path, batching, tensors)
    _check_states(path, batching, tensors)


def _check_controls(path: Path, batching: SequenceBatching, tensors: set[str]) -> None:
    kinds: set[str] = set()
    for i, entry in enumerate(batching.control_input):
        where = f"sequence_batching.control_input[{i}]"
        if entry.name in tensors:
            raise ConfigError(str(path), f"{where}.name", f"'{entry.name}' is also a declared input or output")
        for j, control in enumerate(entry.control):
            if control.kind in kinds:
                raise ConfigError(str(path), f"{where}.control[{j}].kind", f"{control.kind} is given twice")
            kinds.add(control.kind)
            _check_control(path, f"{where}.control[{j}]", control)


def _check_control(path: Path, where: str, control: Control) -> None:
    if control.kind == "CONTROL_SEQUENCE_CORRID":
        if control.data_type not in ("UINT64", "INT64", "UINT32", "INT32", "BYTES"):
            raise ConfigError(str(path), f"{where}.data_type",
                              "CONTROL_SEQUENCE_CORRID needs data_type TYPE_UINT64, TYPE_INT64, "
                              "TYPE_UINT32, TYPE_INT32 or TYPE_STRING")
        return
    pairs = [p for p in (control.int32_false_true, control.fp32_false_true, control.bool_false_true) if p]
    if len(pairs) != 1 or len(pairs[0]) != 2:
        raise ConfigError(str(path), where, f"{control.kind} needs exactly one of int32_false_true, "
                                            "fp32_false_true or bool_false_true, with two values")


def _check_states(path: Path, batching: SequenceBatching, tensors: set[str]) -> None:
    names: set[str] = set()
    for i, state in enumerate(batching.state):
        where = f"sequence_batching.state[{i}]"
        for attr in ("input_name", "output_name"):
            name = getattr(state, attr)
            if name in tensors or name in names:
                raise ConfigError(str(path), f"{where}.{attr}", f"'{name}' is already a tensor name")
            names.add(name)
        if any(d == 0 or d < -1 for d in state.dims):
            raise ConfigError(str(path), f"{where}.dims", f"bad dimension in {list(state.dims)}")
        if len(state.initial_state) > 1:
            raise ConfigError(str(path), f"{where}.initial_state", "give at most one initial state")
        for initial in state.initial_state:
            _check_initial(path, f"{where}.initial_state[0]", state, initial)


def _check_initial(path: Path, where: str, state: State, initial: InitialState) -> None:
    if initial.data_type != state.data_type:
        raise ConfigError(str(path), f"{where}.data_type",
                          f"{initial.data_type} differs from the state's {state.data_type}")
    if -1 in initial.dims or len(initial.dims) != len(state.dims) or any(
            d != -1 and d != i for d, i in zip(state.dims, initial.dims)):
        raise ConfigError(str(path), f"{where}.dims",
                          f"{list(initial.dims)} must be a fixed shape matching the state's {list(state.dims)}")
    if initial.zero_data == bool(initial.data_file):
        raise ConfigError(str(path), where, "set exactly one of zero_data or data_file")
