"""``ensemble_scheduling``: Triton's EnsembleScheduling message as frozen pydantic models.

    ensemble_scheduling {
      step [ {
        model_name: "tokenizer"     # the step's model
        model_version: -1           # -1: the latest ready version
        input_map { key: "TEXT" value: "RAW" }      # step input <- ensemble tensor
        output_map { key: "IDS" value: "ids" }      # step output -> ensemble tensor
      } ]
    }

``check`` adds the rules pydantic cannot see within one config: every tensor a
step consumes is an ensemble input or another step's output, each tensor has
one producer, the steps form no cycle, and every ensemble output is produced.
``step_errors`` checks the steps against the other models of a repository
(known model, its inputs and outputs, its version), once those are known.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

from workers.errors import ConfigError
from workers.repository.pbtxt import map_entries

PLATFORM = "ensemble"
LATEST = -1
# What an ensemble cannot have: it runs no model of its own.
NOT_FOR_ENSEMBLES = ("dynamic_batching", "sequence_batching", "model_transaction_policy.decoupled")

Name = Annotated[str, Strict(), Field(min_length=1)]


def _tensor_map(value: Any) -> Any:
    return map_entries(value, '{ key: "step tensor" value: "ensemble tensor" }', "key {key!r} is mapped more than once")


TensorMap = Annotated[dict[Name, Name], BeforeValidator(_tensor_map)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Step(_Model):
    model_name: Name
    model_version: Annotated[int, Strict(), Field(ge=LATEST)] = LATEST
    input_map: TensorMap = Field(min_length=1)
    output_map: TensorMap = Field(min_length=1)

    @property
    def version(self) -> str:
        """The version as a request names it ('' = the latest)."""
        return "" if self.model_version == LATEST else str(self.model_version)


class EnsembleScheduling(_Model):
    step: tuple[Step, ...] = Field(min_length=1)

    def to_json(self) -> dict[str, Any]:
        return {"step": [step.model_dump(mode="json") for step in self.step]}


def check(path: Path, scheduling: EnsembleScheduling | None, platform: str, inputs: Sequence[str],
          outputs: Sequence[str], set_fields: Sequence[str]) -> None:
    """The rules within one config; ``set_fields`` names the fields the config sets."""
    where = str(path)
    if scheduling is None:
        if platform == PLATFORM:
            raise ConfigError(where, "ensemble_scheduling", "an ensemble needs ensemble_scheduling { step [...] }")
        return
    if platform != PLATFORM:
        raise ConfigError(where, "platform", f"a model with ensemble_scheduling has platform \"{PLATFORM}\", "
                                             f"not {platform!r}")
    for field in NOT_FOR_ENSEMBLES:
        if field in set_fields:
            raise ConfigError(where, field, "an ensemble cannot set this: its steps' models do the batching")
    producers = _producers(where, scheduling, inputs)
    _check_consumed(where, scheduling, producers)
    for index, name in enumerate(outputs):
        if name not in producers:
            raise ConfigError(where, f"output[{index}]", f"ensemble output '{name}' is produced by no step")
        if producers[name] is None:
            raise ConfigError(where, f"output[{index}]", f"ensemble output '{name}' is an ensemble input; "
                                                         "map it through a step")
    cycle = find_cycle(scheduling)
    if cycle:
        path_text = " -> ".join(f"step[{i}] ('{scheduling.step[i].model_name}')" for i in cycle)
        raise ConfigError(where, "ensemble_scheduling.step", f"the steps form a cycle: {path_text}")


def _producers(where: str, scheduling: EnsembleScheduling, inputs: Sequence[str]) -> dict[str, int | None]:
    """Each ensemble tensor and the step that produces it (None: an ensemble input)."""
    producers: dict[str, int | None] = {name: None for name in inputs}
    for index, step in enumerate(scheduling.step):
        for tensor in step.output_map.values():
            if tensor in producers:
                source = "an ensemble input" if producers[tensor] is None else f"step[{producers[tensor]}]"
                raise ConfigError(where, f"ensemble_scheduling.step[{index}].output_map",
                                  f"tensor '{tensor}' is already produced by {source}")
            producers[tensor] = index
    return producers


def _check_consumed(where: str, scheduling: EnsembleScheduling, producers: Mapping[str, int | None]) -> None:
    for index, step in enumerate(scheduling.step):
        for key, tensor in step.input_map.items():
            if tensor not in producers:
                raise ConfigError(where, f"ensemble_scheduling.step[{index}].input_map",
                                  f"input '{key}' of model '{step.model_name}' reads tensor '{tensor}', which "
                                  "no step produces and is not an ensemble input")


def dependencies(scheduling: EnsembleScheduling) -> tuple[frozenset[int], ...]:
    """For each step, the steps whose outputs it reads."""
    producer = {tensor: index for index, step in enumerate(scheduling.step) for tensor in step.output_map.values()}
    return tuple(
        frozenset(producer[t] for t in step.input_map.values() if t in producer) for step in scheduling.step
    )


def find_cycle(scheduling: EnsembleScheduling) -> list[int]:
    """The steps of one dependency cycle, the first repeated at the end; [] if none."""
    needs = dependencies(scheduling)
    state: dict[int, str] = {}
    trail: list[int] = []

    def visit(step: int) -> list[int]:
        state[step] = "open"
        trail.append(step)
        for other in sorted(needs[step]):
            if state.get(other) == "open":
                return trail[trail.index(other):] + [other]
            if other not in state:
                found = visit(other)
                if found:
                    return found
        state[step] = "done"
        trail.pop()
        return []

    for step in range(len(needs)):
        if step not in state:
            found = visit(step)
            if found:
                return found
    return []


class _Entry(Protocol):
    """What ``step_errors`` needs of a repository's ModelEntry."""

    @property
    def path(self) -> Path: ...

    @property
    def config(self) -> Any: ...

    @property
    def versions(self) -> tuple[int, ...]: ...


def step_errors(entries: Mapping[str, _Entry], config_filename: str = "config.pbtxt") -> dict[str, ConfigError]:
    """Ensembles whose steps do not fit the models in ``entries``, with why.
    An ensemble that steps into a rejected ensemble is rejected in turn."""
    valid = dict(entries)
    errors: dict[str, ConfigError] = {}
    changed = True
    while changed:
        changed = False
        for name, entry in list(valid.items()):
            scheduling = getattr(entry.config, "ensemble_scheduling", None)
            if scheduling is None:
                continue
            error = _step_error(entry.path / config_filename, name, scheduling, valid)
            if error is not None:
                errors[name] = error
                del valid[name]
                changed = True
    return errors


def _step_error(path: Path, name: str, scheduling: EnsembleScheduling,
                entries: Mapping[str, _Entry]) -> ConfigError | None:
    for index, step in enumerate(scheduling.step):
        field = f"ensemble_scheduling.step[{index}]"
        if step.model_name == name:
            return ConfigError(str(path), f"{field}.model_name", "an ensemble cannot be a step of itself")
        entry = entries.get(step.model_name)
        if entry is None:
            return ConfigError(str(path), f"{field}.model_name",
                               f"unknown model '{step.model_name}' (or a model the repository rejected)")
        if step.model_version != LATEST and step.model_version not in entry.versions:
            served = ", ".join(map(str, entry.versions))
            return ConfigError(str(path), f"{field}.model_version",
                               f"model '{step.model_name}' has no version {step.model_version} (serving: {served})")
        for kind, mapping, tensors in (("input_map", step.input_map, entry.config.inputs),
                                       ("output_map", step.output_map, entry.config.outputs)):
            names = [t.name for t in tensors]
            for key in mapping:
                if key not in names:
                    role = kind.removesuffix("_map")
                    return ConfigError(str(path), f"{field}.{kind}",
                                       f"model '{step.model_name}' has no {role} '{key}' ({role}s: {', '.join(names)})")
        unmapped = [t.name for t in entry.config.inputs if t.name not in step.input_map and not t.optional]
        if unmapped:
            return ConfigError(str(path), f"{field}.input_map",
                               f"model '{step.model_name}' needs input '{unmapped[0]}', which the step does not map")
    return None
