"""ModelRunner with a test backend passed in through its constructor."""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path

import numpy as np

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
