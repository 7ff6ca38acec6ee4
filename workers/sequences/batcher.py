"""The sequence batcher's driver: queue each step behind its sequence, run
batches the table cuts, and thread implicit state from step to step.

It is given ``run(tensors, instance) -> tensors`` (one merged batch on one
model instance), the model's ``sequence_batching``, a ``SequencePolicy``, the
initial state, a ``StateStore`` and a clock. It knows nothing of transports,
envelopes or backends.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
import structlog

from workers.batching.tensors import batch_key, merge, rows_of, split
from workers.batching.waking import sleep_until
from workers.errors import ExecutionError, SequenceError, SessionLost
from workers.sequences.config import SequenceBatching
from workers.sequences.controls import RowControl, check_sequence_id, control_tensors
from workers.sequences.state import LOST, Checkpoint, LocalStates, SequenceId, StateStore, Tensors
from workers.sequences.table import Batch, Sequence, SequencePolicy, SequenceTable, Step

log = structlog.get_logger("ferry.sequences")

RunOnInstance = Callable[[Tensors, int], Awaitable[Tensors]]
_REMEMBERED = 4096  # ended or timed-out ids kept to explain a late step


@dataclass(slots=True)
class _Work:
    request_id: str
    start: bool
    end: bool
    inputs: Tensors
    future: asyncio.Future[Tensors]


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """What the driver needs to know of the model."""

    model: str
    batching: SequenceBatching
    batched: bool
    initial: Tensors


class SequenceBatcher:
    def __init__(
        self,
        run: RunOnInstance,
        spec: SequenceSpec,
        policy: SequencePolicy,
        store: StateStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._run = run
        self._spec = spec
        self._table: SequenceTable[_Work] = SequenceTable(policy)
        self._store = store or LocalStates()
        self._clock = clock
        self._outputs = {state.output_name: state.input_name for state in spec.batching.state}
        self._gone: OrderedDict[SequenceId, str] = OrderedDict()
        self._wakeup = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self.batches_run = 0

    @property
    def active(self) -> int:
        return len(self._table)

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name=f"sequences-{self._spec.model}")

    async def aclose(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        await asyncio.gather(*self._running, return_exceptions=True)

    async def submit(self, request_id: str, sequence_id: SequenceId | None, start: bool, end: bool,
                     inputs: Tensors) -> Tensors:
        sequence_id = self._check(sequence_id, inputs)
        record = self._table.get(sequence_id)
        if record is None and not start:
            record = await self._resume(sequence_id)
        if record is None:
            record = self._table.activate(sequence_id, self._clock())
            record.state = dict(self._spec.initial)
            await self._store.begin(sequence_id)
        replay = _replayed(record, request_id)
        if replay is not None:
            return replay
        future: asyncio.Future[Tensors] = asyncio.get_running_loop().create_future()
        work = _Work(request_id, start, end, inputs, future)
        self._table.add(Step(sequence_id, work, batch_key(inputs), self._clock()))
        self._wakeup.set()
        return await future

    def _check(self, sequence_id: SequenceId | None, inputs: Tensors) -> SequenceId:
        model = self._spec.model
        if sequence_id is None or sequence_id == 0 or sequence_id == "":
            raise SequenceError(f"model '{model}' is stateful: each request needs a sequence_id "
                                "(a non-zero integer or a non-empty string)")
        check_sequence_id(self._spec.batching, sequence_id)
        if self._spec.batched and rows_of(inputs) != 1:
            raise SequenceError(f"model '{model}': a sequence step must have batch size 1, got {rows_of(inputs)}")
        return sequence_id

    async def _resume(self, sequence_id: SequenceId) -> Sequence[_Work] | None:
        """The sequence from its checkpoint, or the reason it cannot go on."""
        found = await self._store.load(sequence_id)
        record = self._table.get(sequence_id)  # another step may have resumed it meanwhile
        if record is not None:
            return record
        model = self._spec.model
        if found is LOST:
            raise SessionLost(f"sequence {sequence_id!r} of model '{model}' is lost: the worker holding "
                              "its state stopped and the model keeps no checkpoint; start it again")
        if isinstance(found, Checkpoint):
            record = self._table.activate(sequence_id, self._clock())
            record.state = found.state
            record.last = (found.last_request, found.last_outputs)
            log.info("sequence.resumed", model=model, sequence_id=sequence_id)
            return record
        reason = self._gone.get(sequence_id)
        if reason is not None:
            raise SequenceError(f"sequence {sequence_id!r} of model '{model}' has {reason}; "
                                "send sequence_start to begin it again")
        raise SequenceError(f"sequence {sequence_id!r} of model '{model}' is not active: its first "
                            "request must set sequence_start")

    async def _loop(self) -> None:
        while True:
            now = self._clock()
            for sequence_id in self._table.expire(now):
                self._forget(sequence_id, f"timed out after {self._table.policy.idle_s:g}s idle")
            batch = self._table.take(now)
            if batch is not None:
                task = asyncio.create_task(self._execute(batch))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
                continue
            await sleep_until(self._table.next_due(now), self._wakeup, self._clock)

    async def _execute(self, batch: Batch[_Work]) -> None:
        try:
            self.batches_run += 1
            results = await self._results(batch)
            await self._commit(batch.steps, results)
        finally:
            self._table.finish(batch, self._clock())
            for step in batch.steps:
                if step.item.end:
                    self._forget(step.sequence_id, "ended")
            self._wakeup.set()

    async def _results(self, batch: Batch[_Work]) -> list[tuple[Tensors, Tensors] | BaseException]:
        steps = batch.steps
        try:
            return await self._compute(batch)
        except Exception as exc:
            if len(steps) == 1:
                return [exc]
        # One bad step must not fail its batch-mates: run each alone.
        alone: list[tuple[Tensors, Tensors] | BaseException] = []
        for step in steps:
            try:
                alone.extend(await self._compute(Batch(batch.instance, (step,))))
            except Exception as exc:
                alone.append(exc)
        return alone

    async def _compute(self, batch: Batch[_Work]) -> list[tuple[Tensors, Tensors] | BaseException]:
        """Run one batch; per real step, (its outputs, its new state)."""
        template = batch.steps[0].item.inputs
        rows = [self._row(step, template) for step in batch.rows]
        controls = [RowControl(s.sequence_id, s.item.start, s.item.end) if s else RowControl(None)
                    for s in batch.rows]
        tensors = merge(rows)
        tensors.update(control_tensors(self._spec.batching, controls, self._spec.batched))
        outputs = await self._run(tensors, batch.instance)
        per_row = split(outputs, [1] * len(rows)) if self._spec.batched else [dict(outputs)]
        return [self._separate(out) for out, step in zip(per_row, batch.rows) if step is not None]

    def _row(self, step: Step[_Work] | None, template: Tensors) -> Tensors:
        if step is None:
            return {**{name: _blank(a) for name, a in template.items()}, **self._spec.initial}
        record = self._table.get(step.sequence_id)
        state = self._spec.initial if step.item.start or record is None else record.state
        return {**step.item.inputs, **state}

    def _separate(self, outputs: Tensors) -> tuple[Tensors, Tensors]:
        missing = [name for name in self._outputs if name not in outputs]
        if missing:
            raise ExecutionError(f"model '{self._spec.model}' produced no state output '{missing[0]}'")
        state = {self._outputs[name]: np.array(outputs[name], copy=True) for name in self._outputs}
        return {k: v for k, v in outputs.items() if k not in self._outputs}, state

    async def _commit(self, steps: list[Step[_Work]], results: list[tuple[Tensors, Tensors] | BaseException]) -> None:
        """Checkpoint the batch's new states in one call, then keep them and answer each step."""
        done = [(step, result) for step, result in zip(steps, results) if not isinstance(result, BaseException)]
        try:
            await self._store.save([(step.sequence_id, Checkpoint(result[1], step.item.request_id, result[0]))
                                    for step, result in done])
        except Exception as exc:
            log.error("sequence.checkpoint_failed", model=self._spec.model, error=str(exc))
            failed = ExecutionError(f"checkpointing the sequence's state failed ({exc}); "
                                    "the step was not applied, send it again")
            results = [failed if not isinstance(r, BaseException) else r for r in results]
        for step, result in zip(steps, results):
            if isinstance(result, BaseException):
                _settle(step.item.future, error=result)
                continue
            outputs, state = result
            record = self._table.get(step.sequence_id)
            if record is not None:
                record.state = state
                record.last = (step.item.request_id, outputs)
            _settle(step.item.future, outputs)

    def _forget(self, sequence_id: SequenceId, reason: str) -> None:
        record = self._table.get(sequence_id)
        for step in record.steps if record is not None else ():
            if not step.item.future.done():
                step.item.future.set_exception(SequenceError(
                    f"sequence {sequence_id!r} of model '{self._spec.model}' {reason} before this step ran"))
        self._table.release(sequence_id)
        self._gone[sequence_id] = reason
        self._gone.move_to_end(sequence_id)
        while len(self._gone) > _REMEMBERED:
            self._gone.popitem(last=False)
        task = asyncio.create_task(self._drop(sequence_id))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _drop(self, sequence_id: SequenceId) -> None:
        try:
            await self._store.drop(sequence_id)
        except Exception as exc:
            log.warning("sequence.drop_failed", model=self._spec.model, sequence_id=sequence_id, error=str(exc))


def _settle(future: asyncio.Future[Tensors], outputs: Tensors | None = None,
            error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(outputs)  # type: ignore[arg-type]


def _replayed(record: Sequence[_Work], request_id: str) -> Tensors | None:
    """The answer already computed for ``request_id``, when it is delivered again."""
    last_request, last_outputs = record.last
    if request_id and last_request == request_id and last_outputs is not None:
        return last_outputs
    return None


def _blank(array: np.ndarray) -> np.ndarray:
    if array.dtype == object:
        blank = np.empty(array.shape, dtype=object)
        blank.fill(b"")
        return blank
    return np.zeros_like(array)
