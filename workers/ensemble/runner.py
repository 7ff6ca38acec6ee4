"""Hosting an ensemble in a worker, in place of a ``ModelRunner``.

The worker consumes the ensemble's request channel as for any model and hands
each request to ``respond``. That checks the request against the ensemble's
config, runs the plan, and sends each step to its model's request channel
through the ``StepCaller``; tensors pass from step to step as the wire
carries them, renamed by the step's maps, never decoded.

A step's error fails the request with the step named and the step's error
code kept (a bad input is still ``invalid_argument``). The response carries
each step's latency in milliseconds as ``ensemble_step_ms.<model>`` and the
whole ensemble's as ``ensemble_ms``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace

import structlog

from broker import channels
from broker.request_ids import new_request_id
from broker.envelope import ParamValue, Request, Response, WireTensor
from workers.ensemble.caller import StepCaller
from workers.ensemble.plan import TOTAL_LATENCY, Plan, PlannedStep, StepFailure, run_plan
from workers.errors import ExecutionError, ModelLoadError, StepError, WorkerError
from workers.repository.config import ModelConfig
from workers.repository.layout import ModelEntry
from workers.responder import Clocks, error_of
from workers.telemetry import Timeline
from workers.validation import check_outputs, prepare_inputs

log = structlog.get_logger("ferry.ensemble")

# An ensemble only waits on other models, so one worker holds many of its requests at once.
IN_FLIGHT = 256
DEFAULT_STEP_TIMEOUT_S = 300.0

StepConfigs = Callable[[str], ModelConfig]  # a step model's config, by name


class EnsembleRunner:
    def __init__(self, entry: ModelEntry, version: int, caller: StepCaller, step_configs: StepConfigs,
                 prefix: str = channels.PREFIX, clocks: Clocks = Clocks(),
                 step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S) -> None:
        scheduling = entry.config.ensemble_scheduling
        if scheduling is None:
            raise ModelLoadError(f"model '{entry.name}' is not an ensemble")
        self.entry = entry
        self.version = version
        self.config = entry.config
        self.plan = Plan.of(entry.name, scheduling)
        self._caller = caller
        self._step_configs = step_configs
        self._prefix = prefix
        self._clocks = clocks
        self._step_timeout_s = step_timeout_s
        self._channels: dict[int, str] = {}

    @property
    def capacity(self) -> int:
        return IN_FLIGHT

    @property
    def priority_levels(self) -> int:
        return 0

    @property
    def retries_failures(self) -> bool:
        """False: its steps were retried where they ran; retrying it would repeat them all."""
        return False

    async def start(self) -> None:
        """Find each step's request channel; fails if a step's model is unknown here."""
        for step in self.plan.steps:
            try:
                config = self._step_configs(step.model)
            except WorkerError as exc:
                raise ModelLoadError(f"ensemble '{self.entry.name}' step {step.number}: {exc}") from None
            self._channels[step.number] = channels.request_channel(step.model, self._prefix,
                                                                   config.priority_level(0))
        await self._caller.start()
        log.info("model.ready", model=self.entry.name, version=self.version, ensemble_steps=len(self.plan.steps))

    async def aclose(self) -> None:
        self._channels.clear()

    async def respond(self, request: Request, timeline: Timeline | None = None) -> Response:
        """The ensemble's response to ``request``; raises a WorkerError on failure."""
        if timeline is None:
            return await self._respond(request)
        timeline.compute_start_ns = self._clocks.wall_ns()
        response = await self._respond(request)
        timeline.compute_end_ns = self._clocks.wall_ns()
        return response

    def respond_stream(self, request: Request) -> AsyncIterator[Response]:
        # The config check refuses a decoupled ensemble, so no worker streams one.
        raise ExecutionError(f"ensemble '{self.entry.name}' is not decoupled")

    async def _respond(self, request: Request) -> Response:
        prepare_inputs(self.config, request.inputs)
        check_outputs(self.config, request.outputs)
        inputs = {tensor.name: tensor for tensor in request.inputs}
        try:
            result = await run_plan(self.plan, inputs, lambda step, feed: self._call(request, step, feed),
                                    self._clocks.monotonic)
        except StepFailure as failure:
            raise StepError(str(failure), error_of(failure.cause).code) from None
        wanted = request.outputs or tuple(o.name for o in self.config.outputs)
        parameters: dict[str, ParamValue] = {key: round(ms, 3) for key, ms in result.step_ms.items()}
        parameters[TOTAL_LATENCY] = round(result.total_ms, 3)
        return Response(id=request.id, model=self.entry.name, model_version=str(self.version),
                        outputs=tuple(replace(result.tensors[name], name=name) for name in wanted),
                        parameters=parameters)

    async def _call(self, request: Request, step: PlannedStep, feed: dict[str, WireTensor]) -> Mapping[str, WireTensor]:
        step_request = Request(
            id=new_request_id(), model=step.model, model_version=step.version, reply_to="",
            inputs=tuple(replace(tensor, name=name) for name, tensor in feed.items()),
            outputs=tuple(step.outputs), timeout_us=request.timeout_us, deadline_ns=request.deadline_ns,
            trace=request.trace, created_ns=request.created_ns,
        )
        response = await self._caller.call(self._channels[step.number], step_request, self._timeout_s(request))
        if response.error is not None:
            raise StepError(response.error.message, response.error.code)
        return {tensor.name: tensor for tensor in response.outputs}

    def _timeout_s(self, request: Request) -> float:
        if request.deadline_ns <= 0:
            return self._step_timeout_s
        remaining_s = (request.deadline_ns - self._clocks.wall_ns()) / 1e9
        return max(0.0, min(remaining_s, self._step_timeout_s))
