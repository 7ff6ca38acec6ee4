"""Triton's ``model_warmup``: sample requests a model runs before it reports ready.

    model_warmup [ {
      name: "zeros"  batch_size: 1  count: 2
      inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
    } ]

Each input sets exactly one of ``zero_data``, ``random_data`` or
``input_data_file`` (raw row-major bytes; BYTES elements each a 4-byte
length and the bytes), a path relative to the model's ``warmup/`` directory
that must stay inside it. ``dims`` leave out the batch dimension.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, model_validator

from workers.datatypes import config_datatype, to_config_name
from workers.repository.pbtxt import map_entries
from workers.repository.safe_paths import path_problem

WARMUP_DIR = "warmup"


def _dims(value: Any) -> Any:
    if isinstance(value, list) and any(not isinstance(d, int) or isinstance(d, bool) or d < 1 for d in value):
        raise ValueError(f"every dimension must be a size of 1 or more, got {value}")
    return value


def _input_map(value: Any) -> Any:
    return map_entries(value, '{ key: "INPUT0" value: { ... } }')


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WarmupInput(_Model):
    datatype: Annotated[str, BeforeValidator(config_datatype)] = Field(alias="data_type")
    dims: Annotated[tuple[int, ...], BeforeValidator(_dims)] = ()
    zero_data: Annotated[bool, Strict()] = False
    random_data: Annotated[bool, Strict()] = False
    input_data_file: Annotated[str, Strict()] = ""

    @model_validator(mode="after")
    def _one_source(self) -> WarmupInput:
        chosen = [name for name in ("zero_data", "random_data", "input_data_file") if getattr(self, name)]
        if len(chosen) != 1:
            raise ValueError(f"set exactly one of zero_data, random_data, input_data_file (got {chosen or 'none'})")
        if self.input_data_file:
            problem = path_problem(self.input_data_file)
            if problem is not None:
                raise ValueError(f"input_data_file {self.input_data_file!r} must stay inside the model's "
                                 f"{WARMUP_DIR}/ directory: {problem}")
        return self

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"data_type": to_config_name(self.datatype), "dims": list(self.dims)}
        for name in ("zero_data", "random_data", "input_data_file"):
            if getattr(self, name):
                body[name] = getattr(self, name)
        return body


class WarmupSample(_Model):
    name: Annotated[str, Strict(), Field(min_length=1)]
    batch_size: Annotated[int, Strict(), Field(ge=0)] = 0  # 0: unbatched (Triton treats it as 1)
    inputs: Annotated[dict[Annotated[str, Strict()], WarmupInput], BeforeValidator(_input_map)] = Field(
        min_length=1)
    count: Annotated[int, Strict(), Field(ge=0)] = 1

    @property
    def runs(self) -> int:
        return max(1, self.count)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "batch_size": self.batch_size, "count": self.count,
                "inputs": {key: value.to_json() for key, value in self.inputs.items()}}


Warmup = tuple[WarmupSample, ...]
