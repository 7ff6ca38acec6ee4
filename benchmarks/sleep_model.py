"""A stand-in for a GPU-bound model: a Python-backend model that sleeps a fixed time per batch.

The compute costs no CPU, so how throughput grows with workers measures ferry's fan-out
(Redis, the gateway, the workers' fetching) and not the cores the machine happens to have.
Each copy of the model keeps a running count of its batches and rows in
``<stats_dir>/<pid>.json`` (the pid of the process it runs in: its worker's, or the instance
process's the worker started), so a benchmark can tell how evenly the work was spread.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

NAME = "sleep"
INPUT, OUTPUT = "X", "Y"
ROW_FLOATS = 4                       # X and Y: FP32 [ROW_FLOATS] per row
ROW_BYTES = ROW_FLOATS * 4

MODEL_SOURCE = '''
import json
import os
import time
from pathlib import Path


class Model:
    def load(self, context):
        parameters = context.parameters
        self._sleep_s = float(parameters["sleep_ms"]) / 1e3
        self._stats = Path(parameters["stats_dir"]) / f"{os.getpid()}.json"
        self._batches = 0
        self._rows = 0

    def infer(self, inputs):
        x = inputs["X"]
        time.sleep(self._sleep_s)
        self._batches += 1
        self._rows += int(x.shape[0])
        # Rewritten whole and renamed into place, so a reader never sees half a file.
        partial = self._stats.with_suffix(".tmp")
        partial.write_text(json.dumps({"batches": self._batches, "rows": self._rows}))
        os.replace(partial, self._stats)
        return {"Y": x}

    def unload(self):
        pass
'''

CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "{input}" data_type: TYPE_FP32 dims: [ {row} ] }} ]
output [ {{ name: "{output}" data_type: TYPE_FP32 dims: [ {row} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters [
  {{ key: "sleep_ms" value: {{ string_value: "{sleep_ms}" }} }},
  {{ key: "stats_dir" value: {{ string_value: "{stats_dir}" }} }}
]
'''


@dataclass(frozen=True, slots=True)
class SleepModel:
    sleep_ms: float
    max_batch_size: int
    queue_delay_us: int

    def ideal_rows_per_s(self, workers: int) -> float:
        """Every worker running full batches back to back."""
        return workers * self.max_batch_size * 1e3 / self.sleep_ms


@dataclass(frozen=True, slots=True)
class BatchCount:
    batches: int
    rows: int

    def __add__(self, other: BatchCount) -> BatchCount:
        return BatchCount(self.batches + other.batches, self.rows + other.rows)

    def __sub__(self, other: BatchCount) -> BatchCount:
        return BatchCount(self.batches - other.batches, self.rows - other.rows)

    @property
    def mean_batch(self) -> float | None:
        return self.rows / self.batches if self.batches else None


def write_sleep_model(repository: Path, model: SleepModel, stats_dir: Path) -> Path:
    model_dir = repository / NAME
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(MODEL_SOURCE, encoding="utf-8")
    stats_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(CONFIG.format(
        name=NAME, max_batch_size=model.max_batch_size, input=INPUT, output=OUTPUT, row=ROW_FLOATS,
        delay_us=model.queue_delay_us, sleep_ms=model.sleep_ms, stats_dir=stats_dir,
    ), encoding="utf-8")
    return model_dir


def read_counts(stats_dir: Path, pids: Iterable[int]) -> dict[int, BatchCount]:
    """Batches and rows each worker process has run so far (zero before its first batch),
    its instance processes' included."""
    counts = {pid: BatchCount(0, 0) for pid in pids}
    for path in stats_dir.glob("*.json"):
        pid = int(path.stem)
        owner = pid if pid in counts else _parent(pid)
        if owner in counts:
            counts[owner] = counts[owner] + _read_count(path)
    return counts


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None  # gone: its worker stopped
    return int(stat.rpartition(")")[2].split()[1])


def _read_count(path: Path) -> BatchCount:
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        return BatchCount(0, 0)
    return BatchCount(int(body["batches"]), int(body["rows"]))
