"""A model's configuration: Triton's ModelConfig as frozen pydantic models.

``load_config`` validates the plain values ``pbtxt.parse`` gives (Triton's
field names: ``input``, ``data_type: TYPE_FP32``, ``instance_group``...) into
a ``ModelConfig`` with Python names (``inputs``, ``datatype="FP32"``,
``instance_groups``). Every problem is a ``ConfigError`` naming the file and a
dotted field such as ``input[1].data_type``.

``sequence_batching`` lives in ``workers.sequence_config``, ``optimization`` (its
execution accelerators) in ``workers.optimization_config``. Fields ferry does
not implement (``optimization.graph``, ``input[0].format``...) are kept as pydantic extras, logged
once each as ``config.unsupported_field`` and passed through by ``to_json``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import structlog
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError

from workers.datatypes import config_datatype, element_count, to_config_name
from workers.ensemble.config import EnsembleScheduling, check as check_ensemble
from workers.errors import ConfigError, InvalidInput
from workers.optimization_config import Optimization
from workers.pbtxt import parse_file
from workers.sequence_config import SequenceBatching, check as check_sequence_batching
from workers.warmup_config import Warmup

log = structlog.get_logger(__name__)

NonNegInt = Annotated[int, Strict(), Field(ge=0)]
PositiveInt = Annotated[int, Strict(), Field(ge=1)]
StrictStr = Annotated[str, Strict()]
Name = Annotated[str, Strict(), Field(min_length=1)]
Kind = Literal["KIND_AUTO", "KIND_CPU", "KIND_GPU", "KIND_MODEL"]


def _check_dims(dims: tuple[int, ...]) -> tuple[int, ...]:
    for index, dim in enumerate(dims):
        if dim == 0 or dim < -1:
            raise ValueError(f"dimension {index} is {dim}; use -1 for a variable size, else a size of 1 or more")
    return dims


def _parameters(value: Any) -> Any:
    """Protobuf map entries ``[{key, value: {string_value}}]`` -> ``{key: str}``."""
    if not isinstance(value, list):
        return value
    result: dict[Any, Any] = {}
    for index, entry in enumerate(value):
        inner = entry.get("value") if isinstance(entry, dict) else None
        if not isinstance(inner, dict) or not isinstance(entry.get("key"), str) or "string_value" not in inner:
            raise ValueError(f"entry {index} must look like {_MAP_ENTRY}")
        result[entry["key"]] = inner["string_value"]
    return result


_MAP_ENTRY = '{ key: "k" value: { string_value: "v" } }'
Dims = Annotated[tuple[Annotated[int, Strict()], ...], AfterValidator(_check_dims)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)


class Reshape(_Model):
    shape: Dims


class TensorConfig(_Model):
    name: Name
    datatype: Annotated[str, BeforeValidator(config_datatype)] = Field(alias="data_type")
    dims: Dims
    reshape: Reshape | None = None


class InputConfig(TensorConfig):
    optional: Annotated[bool, Strict()] = False


class OutputConfig(TensorConfig):
    pass


class QueuePolicy(_Model):
    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_microseconds: NonNegInt = 0
    allow_timeout_override: Annotated[bool, Strict()] = False
    max_queue_size: NonNegInt = 0


class DynamicBatching(_Model):
    preferred_batch_size: tuple[PositiveInt, ...] = ()
    max_queue_delay_microseconds: NonNegInt = 0
    preserve_ordering: Annotated[bool, Strict()] = False
    priority_levels: NonNegInt = 0
    default_priority_level: NonNegInt = 0
    default_queue_policy: QueuePolicy = QueuePolicy()


class InstanceGroup(_Model):
    name: StrictStr = ""
    count: PositiveInt = 1
    kind: Kind = "KIND_AUTO"
    gpus: tuple[NonNegInt, ...] = ()


class LatestPolicy(_Model):
    num_versions: PositiveInt = 1


class AllPolicy(_Model):
    pass


class SpecificPolicy(_Model):
    versions: tuple[PositiveInt, ...] = Field(min_length=1)


class VersionPolicy(_Model):
    """Triton's oneof: set at most one; none set means ``latest { num_versions: 1 }``."""

    latest: LatestPolicy | None = None
    all: AllPolicy | None = None
    specific: SpecificPolicy | None = None

    @property
    def kind(self) -> Literal["latest", "all", "specific"]:
        if self.all is not None:
            return "all"
        return "specific" if self.specific is not None else "latest"

    def select(self, available: Iterable[int]) -> tuple[int, ...]:
        """The versions this policy serves out of ``available``, ascending."""
        found = sorted(set(available))
        if self.specific is not None:
            return tuple(v for v in found if v in self.specific.versions)
        if self.all is not None:
            return tuple(found)
        count = self.latest.num_versions if self.latest is not None else 1
        return tuple(found[-count:])

    def to_json(self) -> dict[str, Any]:
        if self.specific is not None:
            return {"specific": {"versions": list(self.specific.versions)}}
        if self.all is not None:
            return {"all": {}}
        count = self.latest.num_versions if self.latest is not None else 1
        return {"latest": {"num_versions": count}}


class TransactionPolicy(_Model):
    decoupled: Annotated[bool, Strict()] = False


class ModelConfig(_Model):
    name: Name
    platform: StrictStr = ""
    backend: StrictStr = ""
    max_batch_size: NonNegInt = 0
    inputs: tuple[InputConfig, ...] = Field((), alias="input")
    outputs: tuple[OutputConfig, ...] = Field((), alias="output")
    dynamic_batching: DynamicBatching | None = None
    sequence_batching: SequenceBatching | None = None
    ensemble_scheduling: EnsembleScheduling | None = None  # workers.ensemble.config
    model_transaction_policy: TransactionPolicy = TransactionPolicy()
    instance_groups: tuple[InstanceGroup, ...] = Field(
        (InstanceGroup(),), alias="instance_group", min_length=1
    )
    version_policy: VersionPolicy = VersionPolicy()
    parameters: Annotated[dict[StrictStr, StrictStr], BeforeValidator(_parameters)] = Field(default_factory=dict)
    default_model_filename: StrictStr = ""
    optimization: Optimization | None = None
    model_warmup: Warmup = ()

    @property
    def batching_enabled(self) -> bool:
        return self.max_batch_size > 0

    @property
    def instance_count(self) -> int:
        return sum(group.count for group in self.instance_groups)

    @property
    def decoupled(self) -> bool:
        """Whether the model sends 0..N responses per request (Triton's decoupled mode)."""
        return self.model_transaction_policy.decoupled

    @property
    def state_outputs(self) -> tuple[str, ...]:
        """Outputs the sequence batcher keeps as implicit state, never returned."""
        batching = self.sequence_batching
        return tuple(state.output_name for state in batching.state) if batching else ()

    @property
    def extras(self) -> dict[str, Any]:
        """Top-level fields ferry keeps but does not implement, as parsed."""
        return dict(self.model_extra or {})

    @property
    def priority_levels(self) -> int:
        return self.dynamic_batching.priority_levels if self.dynamic_batching else 0

    @property
    def queue_policy(self) -> QueuePolicy:
        return self.dynamic_batching.default_queue_policy if self.dynamic_batching else QueuePolicy()

    def priority_level(self, priority: int) -> int:
        """The level a request's ``priority`` parameter names (0: the default
        level); 0 for a model without levels. Raises InvalidInput otherwise."""
        levels = self.priority_levels
        if levels == 0:
            if priority != 0:
                raise InvalidInput(f"parameter 'priority': model '{self.name}' has no priority levels")
            return 0
        assert self.dynamic_batching is not None
        level = priority or self.dynamic_batching.default_priority_level
        if not 1 <= level <= levels:
            raise InvalidInput(f"parameter 'priority' must be between 1 and {levels} for model "
                               f"'{self.name}', got {priority}")
        return level

    def input(self, name: str) -> InputConfig | None:
        return next((tensor for tensor in self.inputs if tensor.name == name), None)

    def output(self, name: str) -> OutputConfig | None:
        return next((tensor for tensor in self.outputs if tensor.name == name), None)

    def to_json(self) -> dict[str, Any]:
        """Triton's JSON form, as ``GET /v2/models/{m}/config`` returns it."""
        body: dict[str, Any] = {
            "name": self.name,
            "platform": self.platform,
            "backend": self.backend,
            "version_policy": self.version_policy.to_json(),
            "max_batch_size": self.max_batch_size,
            "input": [_tensor_json(t) for t in self.inputs],
            "output": [_tensor_json(t) for t in self.outputs],
            "instance_group": [g.model_dump(mode="json") for g in self.instance_groups],
            "parameters": {k: {"string_value": v} for k, v in self.parameters.items()},
            "default_model_filename": self.default_model_filename,
        }
        if self.dynamic_batching is not None:
            body["dynamic_batching"] = self.dynamic_batching.model_dump(mode="json")
        if self.sequence_batching is not None:
            body["sequence_batching"] = _sequence_json(self.sequence_batching)
        if self.decoupled:
            body["model_transaction_policy"] = {"decoupled": True}
        if self.ensemble_scheduling is not None:
            body["ensemble_scheduling"] = self.ensemble_scheduling.to_json()
        if self.optimization is not None:
            body["optimization"] = self.optimization.to_json()
        if self.model_warmup:
            body["model_warmup"] = [sample.to_json() for sample in self.model_warmup]
        body.update(self.extras)
        return _plain(body)


def _sequence_json(batching: SequenceBatching) -> dict[str, Any]:
    body = batching.model_dump(mode="json", exclude_none=True)
    for state in body["state"]:
        state["data_type"] = to_config_name(state["data_type"])
        for initial in state["initial_state"]:
            initial["data_type"] = to_config_name(initial["data_type"])
    for entry in body["control_input"]:
        for control in entry["control"]:
            if control["data_type"]:
                control["data_type"] = to_config_name(control["data_type"])
    return body


def _tensor_json(tensor: TensorConfig) -> dict[str, Any]:
    body = tensor.model_dump(mode="json", by_alias=True, exclude_none=True)
    body["data_type"] = to_config_name(tensor.datatype)
    return body


def _plain(value: Any) -> Any:
    """JSON-ready values; protobuf map entries become objects, as in Triton's JSON."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(e, dict) and e.keys() == {"key", "value"} for e in value):
            return {str(e["key"]): _plain(e["value"]) for e in value}
        return [_plain(v) for v in value]
    return value


def parse_config_file(path: Path) -> ModelConfig:
    """Read, parse and validate one ``config.pbtxt`` (no autocomplete)."""
    return load_config(path, parse_file(path))


def load_config(path: Path, parsed: dict[str, Any]) -> ModelConfig:
    """Validate parsed pbtxt values into a ``ModelConfig``."""
    try:
        config = ModelConfig.model_validate(parsed)
    except ValidationError as err:
        raise _config_error(path, err) from None
    _check(path, config)
    _warn_unsupported(path, config, prefix="")
    return _name_groups(config)


def load_version_policy(path: Path, parsed: Any) -> VersionPolicy:
    """Validate ``version_policy`` alone, for choosing versions before autocomplete."""
    try:
        policy = VersionPolicy.model_validate({} if parsed is None else parsed)
    except ValidationError as err:
        raise _config_error(path, err, prefix=("version_policy",)) from None
    _check_version_policy(path, policy)
    return policy


def _config_error(path: Path, err: ValidationError, prefix: tuple[str, ...] = ()) -> ConfigError:
    first = err.errors()[0]
    kind = first["type"]
    message = "expected a message { ... }" if kind in ("model_type", "dict_type") else first["msg"]
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
    elif isinstance(first.get("input"), list):
        message = f"expected one value, got a list (is the field given more than once?): {message}"
    elif kind != "missing" and not isinstance(first.get("input"), dict):
        message = f"{message} (got {first.get('input')!r})"
    return ConfigError(str(path), _dotted(prefix + tuple(first["loc"])), message)


def _dotted(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(config)"


def _check(path: Path, config: ModelConfig) -> None:
    _check_unique(path, "input", config.inputs)
    _check_unique(path, "output", config.outputs)
    for kind, tensors in (("input", config.inputs), ("output", config.outputs)):
        for index, tensor in enumerate(tensors):
            _check_reshape(path, f"{kind}[{index}]", tensor)
    for index, group in enumerate(config.instance_groups):
        if group.gpus and group.kind in ("KIND_CPU", "KIND_MODEL"):
            raise ConfigError(str(path), f"instance_group[{index}].gpus", f"{group.kind} cannot name GPUs")
    if config.dynamic_batching is not None:
        _check_dynamic_batching(path, config.dynamic_batching, config.max_batch_size)
    if config.sequence_batching is not None:
        if config.dynamic_batching is not None:
            raise ConfigError(str(path), "sequence_batching", "set dynamic_batching or sequence_batching, not both")
        names = {t.name for t in config.inputs} | {t.name for t in config.outputs}
        check_sequence_batching(path, config.sequence_batching, config.max_batch_size, names)
        if config.decoupled:
            raise ConfigError(str(path), "model_transaction_policy.decoupled",
                              "ferry does not run decoupled models with sequence_batching")
    check_ensemble(path, config.ensemble_scheduling, config.platform, [t.name for t in config.inputs],
                   [t.name for t in config.outputs], _set_fields(config))
    _check_version_policy(path, config.version_policy)


def _set_fields(config: ModelConfig) -> list[str]:
    fields = [name for name in ("dynamic_batching", "sequence_batching") if getattr(config, name) is not None]
    return fields + (["model_transaction_policy.decoupled"] if config.decoupled else [])


def _check_unique(path: Path, kind: str, tensors: tuple[TensorConfig, ...]) -> None:
    seen: set[str] = set()
    for index, tensor in enumerate(tensors):
        if tensor.name in seen:
            raise ConfigError(str(path), f"{kind}[{index}].name", f"duplicate {kind} name '{tensor.name}'")
        seen.add(tensor.name)


def _check_reshape(path: Path, field: str, tensor: TensorConfig) -> None:
    if tensor.reshape is None or -1 in tensor.dims or -1 in tensor.reshape.shape:
        return
    if element_count(tensor.dims) != element_count(tensor.reshape.shape):
        raise ConfigError(
            str(path), f"{field}.reshape.shape",
            f"shape {list(tensor.reshape.shape)} does not hold the {element_count(tensor.dims)} "
            f"elements of dims {list(tensor.dims)}",
        )


def _check_dynamic_batching(path: Path, batching: DynamicBatching, max_batch_size: int) -> None:
    for size in batching.preferred_batch_size:
        if size > max_batch_size:
            raise ConfigError(
                str(path), "dynamic_batching.preferred_batch_size",
                f"preferred batch size {size} exceeds max_batch_size {max_batch_size}",
            )
    levels, default = batching.priority_levels, batching.default_priority_level
    if levels > 0 and not 1 <= default <= levels:
        raise ConfigError(
            str(path), "dynamic_batching.default_priority_level",
            f"must be between 1 and priority_levels ({levels}), got {default}",
        )


def _check_version_policy(path: Path, policy: VersionPolicy) -> None:
    chosen = [name for name in ("latest", "all", "specific") if getattr(policy, name) is not None]
    if len(chosen) > 1:
        raise ConfigError(str(path), "version_policy", f"set only one of latest, all, specific; got {chosen}")


def _warn_unsupported(path: Path, model: BaseModel, prefix: str) -> None:
    for key in model.model_extra or {}:
        log.warning("config.unsupported_field", file=str(path), field=prefix + key)
    for attr, info in type(model).model_fields.items():
        name = prefix + (info.alias or attr)
        value = getattr(model, attr)
        if isinstance(value, BaseModel):
            _warn_unsupported(path, value, name + ".")
        elif isinstance(value, tuple):
            for index, item in enumerate(value):
                if isinstance(item, BaseModel):
                    _warn_unsupported(path, item, f"{name}[{index}].")


def _name_groups(config: ModelConfig) -> ModelConfig:
    """Unnamed instance groups get Triton's ``<model>_<index>`` names."""
    groups = tuple(
        group if group.name else group.model_copy(update={"name": f"{config.name}_{index}"})
        for index, group in enumerate(config.instance_groups)
    )
    return config.model_copy(update={"instance_groups": groups})
