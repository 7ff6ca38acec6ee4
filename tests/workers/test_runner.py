"""ModelRunner with a test backend passed in through its constructor."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from broker.envelope import Request, WireTensor
from workers.backends.base import ModelContext
from workers.repository.layout import ModelRepository
from workers.runner import ModelRunner

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"


class SlowDouble:
    """Holds each call open until a second one runs beside it (or a timeout)."""

    def __init__(self, tracker: "Tracker") -> None:
        self._tracker = tracker

    def load(self) -> None:
        pass

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._tracker.enter()
        try:
            a, b = inputs["INPUT0"], inputs["INPUT1"]
            return {"OUTPUT0": a + b, "OUTPUT1": a - b}
        finally:
            self._tracker.leave()

    def unload(self) -> None:
        pass


class Tracker:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.both = threading.Event()

    def enter(self) -> None:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            if self.running >= 2:
                self.both.set()
        self.both.wait(timeout=2)

    def leave(self) -> None:
        with self.lock:
            self.running -= 1


def request(n: int) -> Request:
    a = np.full((1, 16), n, dtype=np.float32)
    return Request(id=str(n), model="add_sub", reply_to="r",
                   inputs=(WireTensor("INPUT0", "FP32", (1, 16), a.tobytes()),
                           WireTensor("INPUT1", "FP32", (1, 16), a.tobytes())))


async def test_instance_group_count_gives_that_many_concurrent_executions(tmp_path: Path):
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    config = tmp_path / "add_sub/config.pbtxt"
    text = config.read_text()
    config.write_text(text[: text.index("dynamic_batching")] + "instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    entry = ModelRepository(tmp_path).entry("add_sub")
    tracker = Tracker()
    contexts: list[ModelContext] = []

    def factory(context: ModelContext) -> SlowDouble:
        contexts.append(context)
        return SlowDouble(tracker)

    runner = ModelRunner(entry, 1, backend_factory=factory)
    await runner.start()
    results = await asyncio.gather(runner.infer(request(1)), runner.infer(request(2)))
    await runner.aclose()
    assert [c.instance_index for c in contexts] == [0, 1]
    assert tracker.peak == 2, "the two instances never ran at the same time"
    assert [r["OUTPUT0"][0, 0] for r in results] == [2.0, 4.0]


class Echo:
    """Returns views of its inputs, as an identity model does, and records what it was given."""

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []

    def load(self) -> None:
        pass

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.seen.append(inputs["INPUT0"])
        return {"OUTPUT0": inputs["INPUT0"], "OUTPUT1": inputs["INPUT1"][:, ::-1]}

    def unload(self) -> None:
        pass


async def test_batches_reuse_one_buffer_and_outputs_outlive_it(tmp_path: Path):
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    config = tmp_path / "add_sub/config.pbtxt"
    config.write_text(config.read_text().replace("max_queue_delay_microseconds: 100",
                                                 "max_queue_delay_microseconds: 200000"))
    echo = Echo()
    runner = ModelRunner(ModelRepository(tmp_path).entry("add_sub"), 1, backend_factory=lambda context: echo)
    await runner.start()
    try:
        first = await asyncio.gather(*(runner.infer(request(n)) for n in range(4)))
        second = await asyncio.gather(*(runner.infer(request(n)) for n in range(10, 14)))
    finally:
        await runner.aclose()
    assert [len(batch) for batch in echo.seen] == [4, 4], "the requests were not batched"
    assert np.shares_memory(echo.seen[0], echo.seen[1]), "the second batch was merged into fresh memory"
    for n, outputs in zip([*range(4), *range(10, 14)], [*first, *second]):
        np.testing.assert_array_equal(outputs["OUTPUT0"], np.full((1, 16), n, np.float32))
        np.testing.assert_array_equal(outputs["OUTPUT1"], np.full((1, 16), n, np.float32))


async def infer_twelve(tmp_path: Path, backend: object, delay_us: int | None = None) -> None:
    """Twelve requests, one after the other, to a copy of add_sub served by ``backend``
    (with ``delay_us`` as its max_queue_delay_microseconds when given)."""
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    if delay_us is not None:
        config = tmp_path / "add_sub/config.pbtxt"
        config.write_text(config.read_text().replace("max_queue_delay_microseconds: 100",
                                                     f"max_queue_delay_microseconds: {delay_us}"))
    runner = ModelRunner(ModelRepository(tmp_path).entry("add_sub"), 1,
                         backend_factory=lambda context: backend)
    await runner.start()
    try:
        for n in range(12):
            outputs = await runner.infer(request(n))
            np.testing.assert_array_equal(outputs["OUTPUT0"], np.full((1, 16), 2 * n, np.float32))
    finally:
        await runner.aclose()


class Where:
    """Records the thread each batch ran on; sleeps ``delay_s`` per batch."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.threads: list[str] = []

    def load(self) -> None:
        pass

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.threads.append(threading.current_thread().name)
        if self.delay_s:
            time.sleep(self.delay_s)
        return {"OUTPUT0": inputs["INPUT0"] + inputs["INPUT1"], "OUTPUT1": inputs["INPUT0"] - inputs["INPUT1"]}

    def unload(self) -> None:
        pass


@pytest.mark.parametrize(("delay_s", "inline_after_warmup"), [(0.0, True), (0.002, False)])
async def test_cheap_batches_run_on_the_event_loop_and_slow_ones_on_the_instance_thread(
        tmp_path: Path, delay_s: float, inline_after_warmup: bool):
    where = Where(delay_s)
    await infer_twelve(tmp_path, where)
    loop_thread = threading.current_thread().name
    assert all(name != loop_thread for name in where.threads[:8]), "a batch ran inline before the warm-up"
    assert all((name == loop_thread) == inline_after_warmup for name in where.threads[9:]), where.threads


class Tasks(Where):
    """Records the asyncio task each batch ran in (None on the instance's thread)."""

    def __init__(self, calls_models: bool = False) -> None:
        super().__init__(0.0)
        self.tasks: list[asyncio.Task[object] | None] = []
        self.calls_models = calls_models

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            self.tasks.append(asyncio.current_task())
        except RuntimeError:  # no event loop in this thread
            self.tasks.append(None)
        return super().infer(inputs)


@pytest.mark.parametrize(("delay_us", "calls_models", "runs_in_caller"),
                         [(0, False, True), (200000, False, False), (0, True, False)])
async def test_a_cheap_request_runs_in_its_callers_task_when_an_instance_is_idle(
        tmp_path: Path, delay_us: int, calls_models: bool, runs_in_caller: bool):
    backend = Tasks(calls_models)
    await infer_twelve(tmp_path, backend, delay_us)
    caller = asyncio.current_task()
    assert all(task is None for task in backend.tasks[:8]), "a batch ran on the event loop before the warm-up"
    assert all((task is caller) == runs_in_caller for task in backend.tasks[9:]), backend.tasks

