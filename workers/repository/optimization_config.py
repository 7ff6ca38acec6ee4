"""Triton's ``optimization`` field, as far as ferry acts on it: execution accelerators.

    optimization { execution_accelerators {
      gpu_execution_accelerator: [ { name: "tensorrt"
        parameters { key: "precision_mode" value: "FP16" }
        parameters { key: "max_workspace_size_bytes" value: "1073741824" } } ]
    } }

The ONNX Runtime backend turns a GPU instance's accelerators into execution
providers (``workers.backends.onnxruntime_providers``). Accelerator names and
parameter keys are checked here, so a typo fails the config, naming the key,
instead of being ignored on the GPU. Other ``optimization`` fields (``graph``,
``cuda``, ``priority``, pinned memory...) are kept as extras and logged as
unsupported, like every field ferry does not implement.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationInfo, field_validator

from workers.repository.pbtxt import map_entries

PRECISIONS = ("FP32", "FP16", "INT8")
Precision = Literal["FP32", "FP16", "INT8"]


def _precision(value: str) -> str:
    if value.upper() not in PRECISIONS:
        raise ValueError(f"must be one of {', '.join(PRECISIONS)}, got '{value}'")
    return value.upper()


def _positive_int(value: str) -> str:
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"must be a whole number of 1 or more, got '{value}'")
    return value


def _boolean(value: str) -> str:
    if value.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"must be true or false, got '{value}'")
    return "true" if value.lower() in ("true", "1") else "false"


def _text(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    return value


Check = Callable[[str], str]

# accelerator name -> {parameter key -> check that returns the normal form}.
GPU_ACCELERATORS: Mapping[str, Mapping[str, Check]] = MappingProxyType({
    "tensorrt": MappingProxyType({
        "precision_mode": _precision,
        "max_workspace_size_bytes": _positive_int,
        "minimum_segment_size": _positive_int,
        "max_partition_iterations": _positive_int,
        "trt_engine_cache_enable": _boolean,
        "trt_engine_cache_path": _text,
        "int8_calibration_table_name": _text,
        "int8_use_native_calibration_table": _boolean,
    }),
})
CPU_ACCELERATORS: Mapping[str, Mapping[str, Check]] = MappingProxyType({
    "openvino": MappingProxyType({}),
})


def _parameters(value: Any) -> Any:
    return map_entries(value, '{ key: "k" value: "v" }', "parameter '{key}' is given twice")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")


class Accelerator(_Model):
    name: Annotated[str, Strict(), Field(min_length=1)]
    parameters: Annotated[dict[Annotated[str, Strict()], Annotated[str, Strict()]],
                          BeforeValidator(_parameters)] = Field(default_factory=dict)

    def flag(self, key: str) -> bool:
        return self.parameters.get(key) == "true"


def _check_accelerator(known: Mapping[str, Mapping[str, Check]], accelerator: Accelerator) -> Accelerator:
    checks = known.get(accelerator.name)
    if checks is None:
        raise ValueError(f"unknown accelerator '{accelerator.name}' (ferry supports: {', '.join(known)})")
    normal: dict[str, str] = {}
    for key, value in accelerator.parameters.items():
        check = checks.get(key)
        if check is None:
            allowed = ", ".join(checks) or "none"
            raise ValueError(f"accelerator '{accelerator.name}' has no parameter '{key}' (it takes: {allowed})")
        try:
            normal[key] = check(value)
        except ValueError as err:
            raise ValueError(f"accelerator '{accelerator.name}' parameter '{key}' {err}") from None
    return accelerator.model_copy(update={"parameters": normal})


class ExecutionAccelerators(_Model):
    gpu_execution_accelerator: tuple[Accelerator, ...] = ()
    cpu_execution_accelerator: tuple[Accelerator, ...] = ()

    @field_validator("gpu_execution_accelerator", "cpu_execution_accelerator")
    @classmethod
    def _known(cls, value: tuple[Accelerator, ...], info: ValidationInfo) -> tuple[Accelerator, ...]:
        known = GPU_ACCELERATORS if info.field_name == "gpu_execution_accelerator" else CPU_ACCELERATORS
        checked = tuple(_check_accelerator(known, accelerator) for accelerator in value)
        names = [accelerator.name for accelerator in checked]
        if len(set(names)) != len(names):
            raise ValueError(f"an accelerator is named twice: {names}")
        return checked


class Optimization(_Model):
    execution_accelerators: ExecutionAccelerators = ExecutionAccelerators()

    def gpu_accelerator(self, name: str) -> Accelerator | None:
        return next((a for a in self.execution_accelerators.gpu_execution_accelerator if a.name == name), None)

    def cpu_accelerator(self, name: str) -> Accelerator | None:
        return next((a for a in self.execution_accelerators.cpu_execution_accelerator if a.name == name), None)

    def to_json(self) -> dict[str, Any]:
        """Triton's JSON form: accelerator parameters as an object."""
        return self.model_dump(mode="json")
