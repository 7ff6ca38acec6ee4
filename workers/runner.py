"""One loaded model version: its backend instances and its dynamic batcher.

``ModelRunner`` is one of the two kinds of ``Runner`` (``workers.responder``)
a worker serves a model version with; ``EnsembleRunner``
(``workers.ensemble.runner``) is the other.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import structlog

from broker.envelope import ParamValue, Request, Response, WireTensor
from broker.quick_init import quick_init
from workers.backends import Backend, ModelContext, create_backend
from workers.batching.driver import DynamicBatcher
from workers.batching.forming import BatchPolicy
from workers.batching.buffers import BatchBuffers
from workers.batching.inline import InlineCompute
from workers.batching.tensors import batch_key, rows_of, split
from workers.datatypes import encode_array
from workers.errors import ExecutionError, ModelLoadError, RequestTimeout
from workers.rate_limit import Needs, RateLimiter
from workers.responder import FINAL_FLAG, Clocks
from workers.repository.config import InstanceGroup, ModelConfig
from workers.repository.layout import ModelEntry
from workers.sequences.batcher import SequenceBatcher, SequenceSpec
from workers.sequences.state import LocalStates, StateStore, initial_states
from workers.sequences.table import SequencePolicy
from workers.streaming import stream_outputs
from workers.telemetry import NO_OBSERVER, BatchRecord, Observer, Timeline
from workers.validation import check_outputs, prepare_inputs

log = structlog.get_logger("ferry.runner")

BackendFactory = Callable[[ModelContext], Backend]
StateStoreFactory = Callable[[ModelConfig], StateStore]  # where a model's sequences keep state
Tensors = dict[str, np.ndarray]

@quick_init
@dataclass(frozen=True, slots=True)
class _Item:
    """What waits in the dynamic batcher: a request's inputs and its timeline."""

    tensors: Tensors
    timeline: Timeline | None
    rows: int  # rows_of(tensors) for a batching model, else 1


def batch_policy(config: ModelConfig) -> BatchPolicy:
    dynamic = config.dynamic_batching
    if config.max_batch_size <= 0 or dynamic is None:
        return BatchPolicy(max_batch_size=0)
    return BatchPolicy(
        max_batch_size=config.max_batch_size,
        preferred_sizes=tuple(dynamic.preferred_batch_size),
        max_queue_delay_s=dynamic.max_queue_delay_microseconds / 1e6,
    )


class ModelRunner:
    def __init__(
        self,
        entry: ModelEntry,
        version: int,
        backend_factory: BackendFactory = create_backend,
        clocks: Clocks = Clocks(),
        state_store: StateStoreFactory = lambda config: LocalStates(),
        observer: Observer = NO_OBSERVER,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.entry = entry
        self._limiter = limiter
        self._needs: dict[int, tuple[str, Needs]] = {}  # by id() of the backend: its instance and what it needs
        self.version = version
        self._version_text = str(version)
        self.config = entry.config
        self._output_names = frozenset(output.name for output in entry.config.outputs)  # what each batch must make
        self._factory = backend_factory
        self._clocks = clocks
        self._backends: list[Backend] = []
        self._idle: asyncio.Queue[Backend] = asyncio.Queue()
        self._buffers: dict[int, BatchBuffers] = {}  # by id() of the backend instance they feed
        self._executor: ThreadPoolExecutor | None = None
        self._batcher: DynamicBatcher[_Item, Tensors] | None = None
        self._sequencer: SequenceBatcher | None = None
        self._state_store = state_store
        self._observer = observer
        prefix = uuid.uuid4().hex[:8]  # this runner's; each batch's id adds its count
        self._batch_ids = (f"{prefix}-{n}" for n in itertools.count(1))
        self._inline = InlineCompute()
        self._runs_now = False  # see _may_run_now

    async def start(self) -> None:
        contexts = self._contexts()
        self._executor = ThreadPoolExecutor(len(contexts), thread_name_prefix=f"ferry-{self.entry.name}")
        loop = asyncio.get_running_loop()
        for context in contexts:
            backend = self._factory(context)
            needs = _needs(context.instance)
            if self._limiter is not None:
                self._limiter.register(self.entry.name, needs)
            await loop.run_in_executor(self._executor, backend.load)
            self._backends.append(backend)
            self._needs[id(backend)] = (f"{self.entry.name}/{self.version}#{context.instance_index}", needs)
            self._buffers[id(backend)] = _buffers_for(backend, self.config.max_batch_size)
            if self.config.decoupled and not hasattr(backend, "infer_stream"):
                raise ModelLoadError(f"model '{self.entry.name}' is decoupled, but its backend "
                                     f"{type(backend).__name__} sends one response per request")
            self._idle.put_nowait(backend)
        if self.config.sequence_batching is not None:
            self._sequencer = self._sequence_batcher(len(contexts))
            await self._sequencer.start()
        elif not self.config.decoupled:
            policy = batch_policy(self.config)
            self._batcher = DynamicBatcher(self._run_batch, policy, len(contexts), self._clocks.monotonic)
            await self._batcher.start()
            self._runs_now = policy.cuts_alone and not any(
                getattr(backend, "calls_models", False) or self._limited(backend) for backend in self._backends)
        log.info("model.ready", model=self.entry.name, version=self.version, instances=len(contexts))

    def _sequence_batcher(self, instances: int) -> SequenceBatcher:
        batching = self.config.sequence_batching
        assert batching is not None
        batched = self.config.max_batch_size > 0
        spec = SequenceSpec(self.entry.name, batching, batched,
                            initial_states(batching, self.entry.path, batched))
        policy = SequencePolicy.of(batching, self.config.max_batch_size, instances)
        return SequenceBatcher(self._run_on_instance, spec, policy, self._state_store(self.config),
                               self._clocks.monotonic)

    async def aclose(self) -> None:
        if self._sequencer is not None:
            await self._sequencer.aclose()
        if self._batcher is not None:
            await self._batcher.aclose()
        for backend in self._backends:
            backend.unload()
        self._backends.clear()
        self._buffers.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    @property
    def sequence_batches(self) -> int:
        """Batches the sequence batcher has run (0 for a model without one)."""
        return self._sequencer.batches_run if self._sequencer is not None else 0

    @property
    def priority_levels(self) -> int:
        return self.config.priority_levels

    @property
    def capacity(self) -> int:
        """Requests one full round of this model's instances takes at once."""
        rows = max(1, self.config.max_batch_size)
        return rows * sum(group.count for group in self.config.instance_groups)

    @property
    def retries_failures(self) -> bool:
        return True

    async def respond(self, request: Request, timeline: Timeline | None = None) -> Response:
        return self._response(request, await self.infer(request, timeline))

    async def respond_stream(self, request: Request) -> AsyncIterator[Response]:
        async for outputs in self.infer_stream(request):
            yield self._response(request, outputs, {FINAL_FLAG: False}, final=False)

    def _response(self, request: Request, outputs: Tensors, parameters: dict[str, ParamValue] | None = None,
                  final: bool = True) -> Response:
        return Response(id=request.id, model=self.entry.name, model_version=self._version_text,
                        outputs=tuple([_wire(name, array) for name, array in outputs.items()]),
                        parameters=parameters or {}, final=final)

    async def infer(self, request: Request, timeline: Timeline | None = None) -> Tensors:
        """The request's outputs; ``timeline``, when given, gets its batch's id, size and times."""
        deadline = self._deadline(request)
        if deadline is not None and deadline <= self._clocks.monotonic():
            raise RequestTimeout(f"request to model '{self.entry.name}' timed out in the queue before compute")
        inputs = prepare_inputs(self.config, request.inputs)
        check_outputs(self.config, request.outputs)
        rows = rows_of(inputs) if self.config.max_batch_size > 0 else 1
        if timeline is not None:
            timeline.rows = rows
        if self._sequencer is not None:
            outputs = await self._sequencer.submit(
                request.id, request.sequence_id, request.sequence_start, request.sequence_end, inputs)
            return _select(outputs, request.outputs)
        assert self._batcher is not None, "infer() before start()"
        item = _Item(inputs, timeline, rows)
        if self._may_run_now():
            return _select(self._run_now(item), request.outputs)
        outputs = await self._batcher.submit(
            item,
            rows=rows,
            key=batch_key(inputs),
            priority=self.config.priority_level(request.priority),
            deadline=deadline,
        )
        return _select(outputs, request.outputs)

    async def infer_stream(self, request: Request) -> AsyncIterator[Tensors]:
        """A decoupled model's responses to ``request``, as the model sends them."""
        inputs = prepare_inputs(self.config, request.inputs)
        check_outputs(self.config, request.outputs)
        backend = await self._idle.get()
        try:
            assert self._executor is not None, "infer_stream() before start()"
            async with self._held(backend):
                async for outputs in stream_outputs(backend, inputs, self._executor):  # type: ignore[arg-type]
                    yield _select(outputs, request.outputs)
        finally:
            self._idle.put_nowait(backend)

    def _contexts(self) -> list[ModelContext]:
        contexts: list[ModelContext] = []
        for group in self.config.instance_groups:
            for _ in range(group.count):
                contexts.append(ModelContext(
                    name=self.entry.name,
                    version=self.version,
                    version_dir=self.entry.path / str(self.version),
                    model_file=self.entry.model_file(self.version),
                    config=self.config,
                    instance=group,
                    instance_index=len(contexts),
                ))
        return contexts

    def _deadline(self, request: Request) -> float | None:
        """The request's own deadline, else the model's default timeout counted
        from when the gateway enqueued it (Triton's default_timeout_microseconds)."""
        deadline_ns = request.deadline_ns
        default_us = self.config.queue_policy.default_timeout_microseconds
        if deadline_ns <= 0 and default_us > 0 and request.created_ns > 0:
            deadline_ns = request.created_ns + default_us * 1000
        if deadline_ns <= 0:
            return None
        remaining_s = (deadline_ns - self._clocks.wall_ns()) / 1e9
        return self._clocks.monotonic() + remaining_s

    async def _run_on_instance(self, tensors: Tensors, instance: int) -> Tensors:
        """One merged sequence batch on the instance the sequence table chose."""
        backend = self._backends[instance]
        loop = asyncio.get_running_loop()
        start = self._clocks.wall_ns()
        try:
            async with self._held(backend):
                outputs = await loop.run_in_executor(self._executor, backend.infer, tensors)
        finally:
            rows = rows_of(tensors) if self.config.max_batch_size > 0 else 1
            end = self._clocks.wall_ns()
            self._observer.batch_ran(BatchRecord(self.entry.name, str(self.version), next(self._batch_ids),
                                                 rows, 1, start, end, infer_ns=end - start))
        missing = [o.name for o in self.config.outputs if o.name not in outputs]
        if missing:
            raise ExecutionError(f"model '{self.entry.name}' produced no output '{missing[0]}'")
        return outputs

    def _may_run_now(self) -> bool:
        """Whether a request may skip the batcher's queue, loop and task: an instance is
        idle, the policy waits for no batch-mates (so the batcher would cut it at once,
        alone or with what waits), and batches are cheap enough to run on the event loop
        (``workers.batching.inline``). It then runs in the caller's own task, with no
        ``await`` between taking the instance and giving it back, so nothing else runs
        meanwhile and no cancellation can leave the instance computing unheld.

        Requests already queued are not waited for: the batcher's task goes on taking them,
        a batch each time it runs, while newcomers run now, so the queue drains (a backlog
        builds only while batches go to the thread, the warm-up's first). Waiting for them
        instead kept every later request queued for as long as requests kept arriving
        faster than the batcher's task took them."""
        return self._runs_now and not self._idle.empty() and self._inline.inline()

    def _run_now(self, item: _Item) -> Tensors:
        backend = self._idle.get_nowait()
        start = self._clocks.wall_ns()
        phases = _Phases()
        try:
            return self._compute(backend, (item,), phases)[0]
        finally:
            self._ran(backend, (item,), start, phases, inline=True)

    async def _run_batch(self, batch: Sequence[_Item]) -> Sequence[Tensors | BaseException]:
        backend = await self._idle.get()
        start = self._clocks.wall_ns()
        phases = _Phases()
        inline = False
        try:
            async with self._held(backend):
                # Cheaper than handing it to the thread (workers.batching.inline), unless the model may call
                # other models (BLS), whose replies need this event loop free while it waits.
                inline = not getattr(backend, "calls_models", False) and self._inline.inline()
                if inline:
                    return self._compute(backend, batch, phases)
                loop = asyncio.get_running_loop()
                # A batch that takes a while (merging and splitting copy whole batches) stays off the event loop.
                return await loop.run_in_executor(self._executor, self._compute, backend, batch, phases)
        finally:
            self._ran(backend, batch, start, phases, inline)

    def _ran(self, backend: Backend, batch: Sequence[_Item], start: int, phases: _Phases, inline: bool) -> None:
        """A batch is done on ``backend``: the instance is free again, and what it took is learnt and recorded."""
        self._idle.put_nowait(backend)
        self._inline.took(phases.elapsed_ns / 1e9, inline)
        self._record(batch, start, phases)

    def _held(self, backend: Backend) -> AbstractAsyncContextManager[None]:
        """The rate limiter's turn for this instance (none to wait for without one)."""
        if not self._limited(backend):
            return nullcontext()
        assert self._limiter is not None
        return self._limiter.hold(*self._needs[id(backend)])

    def _limited(self, backend: Backend) -> bool:
        """Whether the instance waits for the rate limiter's turn."""
        held = self._needs.get(id(backend))
        return self._limiter is not None and held is not None and bool(held[1].resources)

    def _record(self, batch: Sequence[_Item], start: int, phases: _Phases) -> None:
        rows = sum(item.rows for item in batch)
        record = BatchRecord(self.entry.name, self._version_text, next(self._batch_ids), rows, len(batch),
                             start, self._clocks.wall_ns(), phases.input_ns, phases.infer_ns, phases.output_ns)
        for item in batch:
            if item.timeline is not None:
                item.timeline.ran_in(record)
        self._observer.batch_ran(record)

    def _compute(self, backend: Backend, items: Sequence[_Item], phases: _Phases) -> list[Tensors]:
        buffers = self._buffers[id(backend)]
        began = time.perf_counter_ns()
        try:
            merged = buffers.merge([item.tensors for item in items])
            merged_at = time.perf_counter_ns()
            raw = backend.infer(merged)
            ran_at = time.perf_counter_ns()
            # The buffers are the next batch's on this instance as soon as it is idle again.
            outputs = buffers.detach(raw)
            if not outputs.keys() >= self._output_names:
                missing = next(o.name for o in self.config.outputs if o.name not in outputs)
                raise ExecutionError(f"model '{self.entry.name}' produced no output '{missing}'")
            results: list[Tensors] = (
                [outputs] if self.config.max_batch_size <= 0 else list(split(outputs, [item.rows for item in items])))
            phases.input_ns, phases.infer_ns = merged_at - began, ran_at - merged_at
            phases.output_ns = time.perf_counter_ns() - ran_at
            return results
        finally:
            phases.elapsed_ns = time.perf_counter_ns() - began  # a failed batch's too


@dataclass(slots=True)
class _Phases:
    """How long a batch took to merge, run and split (written by the thread that ran it)."""

    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    elapsed_ns: int = 0  # all of it, a failed batch's included


def _needs(group: InstanceGroup) -> Needs:
    limits = group.rate_limiter
    if limits is None:
        return Needs()
    return Needs(tuple((r.name, r.count) for r in limits.resources), max(1, limits.priority))


def _buffers_for(backend: Backend, max_batch_size: int) -> BatchBuffers:
    """Pinned buffers for a backend that asks for them, used for single requests too
    (their own bytes are not pinned); numpy buffers for batches of two or more otherwise."""
    host_allocator = getattr(backend, "host_allocator", None)
    allocate = host_allocator() if host_allocator is not None else None
    if allocate is None:
        return BatchBuffers(max_batch_size)
    return BatchBuffers(max_batch_size, allocate, copy_single=True)


def _select(outputs: Tensors, wanted: Sequence[str]) -> Tensors:
    return {name: outputs[name] for name in wanted} if wanted else outputs


def _wire(name: str, array: np.ndarray) -> WireTensor:
    datatype, data = encode_array(array)
    return WireTensor(name=name, datatype=datatype, shape=tuple(array.shape), data=data)
