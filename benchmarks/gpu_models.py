"""The model repository of ``bench_gpu.py`` and its baseline, the same TorchScript module run by
torch in the benchmark's own process.

``resnet50``: torchvision's ResNet-50 with random weights, in FP16, traced to TorchScript;
``max_batch_size`` 64, dynamic batching (preferred 32 and 64, 2 ms delay), ``KIND_GPU`` x N on GPU 0.
On ``--device cpu`` a tiny stand-in with the same input and output names (3x64x64 FP16 in,
1000 FP16 out) on ``KIND_CPU``, to try the benchmark on a machine without a GPU. Beside it,
``bench_cpu.py``'s ONNX identity models (16 x FP32 is the request-rate row).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from benchmarks.identity_models import write_identity_models
from benchmarks.loadgen import TensorSpec
from benchmarks.stats import Summary, summarize
from benchmarks.window import Window

MODEL = "resnet50"
CLASSES = 1000
STREAMS, STREAM_BATCH = 2, 64
WARMUP_CALLS = 5

CONFIG = """name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 64
input [ {{ name: "INPUT__0" data_type: TYPE_FP16 dims: [ 3, {side}, {side} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP16 dims: [ {classes} ] }} ]
dynamic_batching {{ preferred_batch_size: [ 32, 64 ] max_queue_delay_microseconds: 2000 }}
instance_group [ {{ count: {instances} kind: {kind}{gpus} }} ]
"""


@dataclass(frozen=True, slots=True)
class Device:
    name: str           # "cuda" or "cpu"

    @property
    def kind(self) -> str:
        return "KIND_GPU" if self.name == "cuda" else "KIND_CPU"

    @property
    def gpus(self) -> str:
        """Every instance on GPU 0, where the baseline runs, however many the machine has."""
        return " gpus: [ 0 ]" if self.name == "cuda" else ""

    @property
    def side(self) -> int:
        return 224 if self.name == "cuda" else 64

    def image(self) -> TensorSpec:
        """One request's input: a single FP16 image."""
        data = np.random.default_rng(1).standard_normal((1, 3, self.side, self.side)).astype(np.float16)
        return TensorSpec("INPUT__0", "FP16", data.shape, data.tobytes())


def _network(device: Device) -> Any:
    import torch

    if device.name == "cpu":
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.AdaptiveAvgPool2d(1),
                                   torch.nn.Flatten(), torch.nn.Linear(8, CLASSES))
    try:
        import torchvision
    except ImportError as exc:
        raise SystemExit("bench_gpu.py --device cuda needs torchvision (for ResNet-50), built for this torch") from exc
    return torchvision.models.resnet50(weights=None)


def write_repository(repository: Path, device: Device, instances: int) -> Path:
    """The models above; returns the TorchScript file, which the baseline loads too."""
    import torch

    model_dir = repository / MODEL
    (model_dir / "1").mkdir(parents=True)
    network = _network(device).eval().half().to(device.name)
    example = torch.randn(8, 3, device.side, device.side, device=device.name, dtype=torch.float16)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # newer torch deprecates tracing; ferry serves it
        traced = torch.jit.trace(network, example)
    path = model_dir / "1" / "model.pt"
    traced.save(str(path))
    (model_dir / "config.pbtxt").write_text(CONFIG.format(
        name=MODEL, side=device.side, classes=CLASSES, instances=instances, kind=device.kind, gpus=device.gpus))
    write_identity_models(repository, batching=True)
    return path


def torch_baseline(model_path: Path, device: Device, batches: tuple[int, ...], window: Window) -> list[Summary]:
    """numpy -> device -> numpy in a loop at each batch size, then ``STREAMS`` threads (each on a
    CUDA stream of its own on a GPU) at ``STREAM_BATCH``: the best of these is the baseline."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        module = torch.jit.load(str(model_path), map_location=device.name).eval()
    try:
        rows = [_one_thread(module, device, batch, window) for batch in batches]
        rows.append(_threads(module, device, window))
        return rows
    finally:
        del module
        if device.name == "cuda":
            torch.cuda.empty_cache()  # leave the GPU's memory to the servers measured next


def _host_batch(device: Device, batch: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((batch, 3, device.side, device.side)).astype(np.float16)


def _caller(module: Any, device: Device, batch: int) -> Callable[[], None]:
    import torch

    host = _host_batch(device, batch)

    def call() -> None:
        module(torch.from_numpy(host).to(device.name, non_blocking=True)).cpu().numpy()
    return call


def _timed_calls(call: Callable[[], None], window: Window) -> list[float]:
    """Latencies of the calls that ended inside the measured window, after ``window.warmup_s``
    (as ``loadgen.py`` counts responses)."""
    import torch

    with torch.inference_mode():
        for _ in range(WARMUP_CALLS):
            call()
        start = perf_counter()
        measured_from, end = start + window.warmup_s, start + window.warmup_s + window.duration_s
        latencies = []
        while (began := perf_counter()) < end:
            call()
            finished = perf_counter()
            if measured_from <= finished <= end:
                latencies.append(finished - began)
    return latencies


def _one_thread(module: Any, device: Device, batch: int, window: Window) -> Summary:
    latencies = _timed_calls(_caller(module, device, batch), window)
    return summarize("torch in-process", f"batch {batch}", latencies, len(latencies) * batch, window.duration_s)


def _threads(module: Any, device: Device, window: Window) -> Summary:
    import torch

    results: list[list[float]] = [[] for _ in range(STREAMS)]

    def feed(index: int) -> None:
        stream = torch.cuda.Stream() if device.name == "cuda" else None
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            results[index] = _timed_calls(_caller(module, device, STREAM_BATCH), window)

    threads = [threading.Thread(target=feed, args=(index,)) for index in range(STREAMS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    latencies = [latency for result in results for latency in result]
    lanes = "streams" if device.name == "cuda" else "threads"
    return summarize("torch in-process", f"{STREAMS} {lanes} x {STREAM_BATCH}", latencies,
                     len(latencies) * STREAM_BATCH, window.duration_s)
