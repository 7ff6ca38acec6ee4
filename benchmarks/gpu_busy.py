"""How busy the GPU was over a measured window: ``nvidia-smi``'s utilization of GPU 0 (the share of
time a kernel was running), read every ``INTERVAL_MS`` by a background thread. Where there is no
``nvidia-smi`` (a run with ``--device cpu``) every figure is None."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
from collections.abc import Iterator
from time import perf_counter

INTERVAL_MS = 200


class GpuBusy:
    def __init__(self) -> None:
        self._samples: list[tuple[float, float]] = []    # (perf_counter, percent)

    def between(self, start: float, end: float) -> float | None:
        """The mean utilization (0 to 1) of the samples read between ``start`` and ``end``."""
        inside = [percent for at, percent in self._samples if start <= at <= end]
        return sum(inside) / len(inside) / 100 if inside else None

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for text in process.stdout:
            with contextlib.suppress(ValueError):   # a GPU reported as "[N/A]"
                self._samples.append((perf_counter(), float(text.split(",")[0])))


@contextlib.contextmanager
def sampling() -> Iterator[GpuBusy]:
    busy = GpuBusy()
    if shutil.which("nvidia-smi") is None:
        yield busy
        return
    command = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "--id=0",
               f"--loop-ms={INTERVAL_MS}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    reader = threading.Thread(target=busy._read, args=(process,), daemon=True)
    reader.start()
    try:
        yield busy
    finally:
        process.terminate()
        process.wait()
        reader.join(timeout=5)
