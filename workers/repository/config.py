"""A model's configuration: Triton's ModelConfig as frozen pydantic models.

The fields have Python names (``inputs`` for ``input``, ``datatype="FP32"`` for
``data_type: TYPE_FP32``, ``instance_groups``...); ``to_json`` gives Triton's
JSON form back. ``workers.repository.config_file`` reads a ``config.pbtxt``
into a ``ModelConfig``.

``sequence_batching`` lives in ``workers.sequences.config``, ``optimization`` (its
execution accelerators) in ``workers.repository.optimization_config``. Fields ferry does
not implement (``optimization.graph``, ``input[0].format``...) are kept as pydantic extras
and passed through by ``to_json``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict

from workers.datatypes import config_datatype, to_config_name
from workers.ensemble.config import EnsembleScheduling
from workers.errors import InvalidInput
from workers.repository.optimization_config import Optimization
from workers.repository.warmup_config import Warmup
from workers.sequences.config import SequenceBatching

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
    label_filename: StrictStr = ""  # class labels, one per line, for Triton's classification extension


class QueuePolicy(_Model):
    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_microseconds: NonNegInt = 0
    allow_timeout_override: Annotated[bool, Strict()] = False
    max_queue_size: NonNegInt = 0


_NO_QUEUE_POLICY = QueuePolicy()  # a model without dynamic batching's (frozen: one serves them all)


class DynamicBatching(_Model):
    preferred_batch_size: tuple[PositiveInt, ...] = ()
    max_queue_delay_microseconds: NonNegInt = 0
    preserve_ordering: Annotated[bool, Strict()] = False
    priority_levels: NonNegInt = 0
    default_priority_level: NonNegInt = 0
    default_queue_policy: QueuePolicy = QueuePolicy()


class RateLimiterResource(_Model):
    name: StrictStr = Field(min_length=1)
    count: PositiveInt = 1
    global_: Annotated[bool, Strict()] = Field(False, alias="global")


class RateLimiterConfig(_Model):
    resources: tuple[RateLimiterResource, ...] = Field((), alias="resources")
    priority: NonNegInt = 1


class InstanceGroup(_Model):
    name: StrictStr = ""
    count: PositiveInt = 1
    kind: Kind = "KIND_AUTO"
    gpus: tuple[NonNegInt, ...] = ()
    rate_limiter: RateLimiterConfig | None = None


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


class ResponseCacheConfig(_Model):
    enable: Annotated[bool, Strict()] = False


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
    response_cache: ResponseCacheConfig = ResponseCacheConfig()

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
        return self.dynamic_batching.default_queue_policy if self.dynamic_batching else _NO_QUEUE_POLICY

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
            "instance_group": [g.model_dump(mode="json", exclude_none=True, by_alias=True)
                               for g in self.instance_groups],
            "parameters": {k: {"string_value": v} for k, v in self.parameters.items()},
            "default_model_filename": self.default_model_filename,
        }
        if self.dynamic_batching is not None:
            body["dynamic_batching"] = self.dynamic_batching.model_dump(mode="json")
        if self.sequence_batching is not None:
            body["sequence_batching"] = _sequence_json(self.sequence_batching)
        if self.decoupled:
            body["model_transaction_policy"] = {"decoupled": True}
        if self.response_cache.enable:
            body["response_cache"] = {"enable": True}
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
