"""An ensemble's steps as a dependency graph, and running them.

``Plan`` is pure: which ensemble tensors each step reads and writes, and the
name each step's latency is reported under. ``run_plan`` starts every step as
soon as the tensors it reads exist, so independent steps run concurrently;
it knows nothing of requests, envelopes or transports, only a ``call``
coroutine that runs one step on its inputs. The first step to fail cancels
the others and is raised as ``StepFailure``, naming the step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from workers.ensemble.config import EnsembleScheduling

T = TypeVar("T")
LATENCY_PREFIX = "ensemble_step_ms."
TOTAL_LATENCY = "ensemble_ms"


@dataclass(frozen=True, slots=True)
class PlannedStep:
    number: int  # 1-based, as errors name it
    model: str
    version: str  # '' = the latest
    inputs: Mapping[str, str]  # the step model's input -> the ensemble tensor it reads
    outputs: Mapping[str, str]  # the step model's output -> the ensemble tensor it writes
    latency_key: str  # the response parameter that reports this step's milliseconds

    @property
    def reads(self) -> frozenset[str]:
        return frozenset(self.inputs.values())


@dataclass(frozen=True, slots=True)
class Plan:
    name: str
    steps: tuple[PlannedStep, ...]

    @classmethod
    def of(cls, name: str, scheduling: EnsembleScheduling) -> Plan:
        steps = []
        seen: dict[str, int] = {}
        for index, step in enumerate(scheduling.step):
            seen[step.model_name] = seen.get(step.model_name, 0) + 1
            # A model used by two steps reports the second as <model>.2, and so on.
            suffix = "" if seen[step.model_name] == 1 else f".{seen[step.model_name]}"
            steps.append(PlannedStep(index + 1, step.model_name, step.version, dict(step.input_map),
                                     dict(step.output_map), f"{LATENCY_PREFIX}{step.model_name}{suffix}"))
        return cls(name, tuple(steps))

    def runnable(self, available: Mapping[str, object], started: set[int]) -> list[PlannedStep]:
        """Steps not started yet whose every input tensor is available."""
        return [s for s in self.steps if s.number not in started and s.reads <= available.keys()]


class StepFailure(Exception):
    """A step failed; ``cause`` is its error."""

    def __init__(self, plan: Plan, step: PlannedStep, cause: BaseException) -> None:
        super().__init__(f"ensemble '{plan.name}' step {step.number} (model '{step.model}'): {cause}")
        self.step = step
        self.cause = cause


StepCall = Callable[[PlannedStep, dict[str, T]], Awaitable[Mapping[str, T]]]


@dataclass(frozen=True, slots=True)
class PlanResult(Generic[T]):
    tensors: dict[str, T]  # every ensemble tensor: the inputs and each step's outputs
    step_ms: dict[str, float]  # latency_key -> milliseconds
    total_ms: float


async def run_plan(plan: Plan, inputs: Mapping[str, T], call: StepCall[T],
                   clock: Callable[[], float] = time.monotonic) -> PlanResult[T]:
    """Run every step, each once its inputs exist; ``call`` returns a step's
    outputs by the step model's output names."""
    tensors: dict[str, T] = dict(inputs)
    started: set[int] = set()
    step_ms: dict[str, float] = {}
    running: dict[asyncio.Task[Mapping[str, T]], tuple[PlannedStep, float]] = {}
    began = clock()
    try:
        while True:
            for step in plan.runnable(tensors, started):
                started.add(step.number)
                feed = {name: tensors[tensor] for name, tensor in step.inputs.items()}
                running[asyncio.ensure_future(call(step, feed))] = (step, clock())
            if not running:
                break
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                step, start = running.pop(task)
                _collect(plan, step, task, tensors)
                step_ms[step.latency_key] = (clock() - start) * 1000.0
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    never = [s for s in plan.steps if s.number not in started]
    if never:
        # The config checks rule this out; a plan built without them may still get here.
        missing = sorted(never[0].reads - tensors.keys())
        raise StepFailure(plan, never[0], LookupError(f"its input tensor '{missing[0]}' was never produced"))
    return PlanResult(tensors, step_ms, (clock() - began) * 1000.0)


def _collect(plan: Plan, step: PlannedStep, task: asyncio.Task[Mapping[str, T]], tensors: dict[str, T]) -> None:
    error = task.exception()
    if error is not None:
        raise StepFailure(plan, step, error)
    outputs = task.result()
    for name, tensor in step.outputs.items():
        if name not in outputs:
            raise StepFailure(plan, step, LookupError(f"the model returned no output '{name}'"))
        tensors[tensor] = outputs[name]
