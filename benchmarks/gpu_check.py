"""GPU check: which GPU paths this machine has and, for each one present, its
results against ONNX Runtime on the CPU and its throughput on model_repo/cnn.

    python -m benchmarks.gpu_check --out gpu_check.json [--seconds 1] [--batches 1,8,64]

Paths (each through ferry's own backend classes and config parsing):

    cpu            ONNX Runtime, CPU provider: the reference and the baseline
    tensorrt       the TensorRT backend on engines built here (FP32, FP16)
    ort-tensorrt   ONNX Runtime's TensorRT provider, Triton's precision_mode (FP32, FP16)
    ort-cuda       ONNX Runtime's CUDA provider (FP32; FP16 would need an FP16 model)
    cuda-memory    the TensorRT backend's device buffers: a round trip and copy speed

A path that cannot run here is listed as skipped with the reason; one that
runs and fails is listed as failed (exit status 1). Runs on a machine without
a GPU too, reporting every GPU path skipped.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "model_repo/cnn"
IMAGE = (3, 128, 128)
TOLERANCE = {"FP32": 1e-4, "FP16": 2e-2}
GPU_EXTRA = "pip install 'ferry[gpu]'"

Infer = Callable[[np.ndarray], np.ndarray]


@dataclass
class Row:
    path: str
    precision: str
    batch: int | None
    status: str  # ok | mismatch | skipped | failed
    reason: str = ""
    max_abs_err: float | None = None
    images_per_s: float | None = None
    p50_ms: float | None = None
    ratio_to_cpu: float | None = None


# --- what this machine has -------------------------------------------------------


def _version(module: str) -> str | None:
    try:
        return str(getattr(importlib.import_module(module), "__version__", "unknown"))
    except Exception:  # a broken install counts as absent  # noqa: BLE001
        return None


def _cuda_runtime() -> tuple[int, str, str]:
    """(device count, first device's name, why none)."""
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
        return 0, "", "cuda-python (cuda.bindings), which ferry's TensorRT backend uses, is not installed"
    from cuda.bindings import runtime as cudart

    err, count = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess:
        return 0, "", f"the CUDA runtime says {err.name}"
    if count == 0:
        return 0, "", "the CUDA runtime sees no device"
    err, props = cudart.cudaGetDeviceProperties(0)
    name = props.name.decode(errors="replace").rstrip("\0") if err == cudart.cudaError_t.cudaSuccess else "?"
    return count, name, ""


def _torch_cuda() -> str:
    if importlib.util.find_spec("torch") is None:
        return "torch not installed"
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__}: no CUDA device"
    return f"torch {torch.__version__}: {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"


def environment() -> dict[str, Any]:
    import onnxruntime as ort

    count, name, why = _cuda_runtime()
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "onnxruntime": ort.__version__,
        "onnxruntime_providers": ort.get_available_providers(),
        "tensorrt": _version("tensorrt"),
        "cuda_bindings": _version("cuda.bindings"),
        "cuda_devices": count,
        "cuda_device_name": name,
        "cuda_why_none": why,
        "torch": _torch_cuda(),
    }


def skip_reason(path: str, env: dict[str, Any]) -> str | None:
    no_gpu = f"no NVIDIA GPU usable here: {env['cuda_why_none']}" if env["cuda_devices"] == 0 else None
    providers = env["onnxruntime_providers"]
    if path == "cuda-memory":
        return no_gpu
    if path == "tensorrt":
        if env["tensorrt"] is None:
            return f"the tensorrt package is not installed ({GPU_EXTRA})"
        return no_gpu
    provider = {"ort-cuda": "CUDAExecutionProvider", "ort-tensorrt": "TensorrtExecutionProvider"}[path]
    if provider not in providers:
        return (f"onnxruntime {env['onnxruntime']} has no {provider} (it has: {', '.join(providers)}); "
                f"onnxruntime-gpu is not installed ({GPU_EXTRA})")
    return no_gpu


# --- the paths --------------------------------------------------------------------


def _repo(folder: Path, name: str, config: str, model: Path) -> Any:
    from workers.backends.base import ModelContext
    from workers.repository.layout import ModelRepository

    (folder / name / "1").mkdir(parents=True)
    shutil.copy(model, folder / name / "1" / model.name)
    (folder / name / "config.pbtxt").write_text(config.replace("NAME", name))
    entry = ModelRepository(folder).entry(name)
    return ModelContext(name, 1, entry.path / "1", entry.model_file(1), entry.config, entry.config.instance_groups[0])


CONFIG = """name: "NAME"
{platform}
max_batch_size: 64
input [ {{ name: "IMAGE" data_type: TYPE_FP32 dims: [ 3, 128, 128 ] }} ]
output [ {{ name: "PROBS" data_type: TYPE_FP32 dims: [ 10 ] }} ]
instance_group [ {{ count: 1 kind: {kind} gpus: [ 0 ] }} ]
{optimization}
"""
CPU_CONFIG = CONFIG.replace(" gpus: [ 0 ]", "")
ORT_TENSORRT = ('optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt"\n'
                '  parameters { key: "precision_mode" value: "%s" }\n'
                '  parameters { key: "max_workspace_size_bytes" value: "1073741824" } } ] } }')


def ort_backend(folder: Path, kind: str, optimization: str = "") -> Any:
    from workers.backends.onnxruntime import OnnxRuntimeBackend

    template = CPU_CONFIG if kind == "KIND_CPU" else CONFIG
    config = template.format(platform='platform: "onnxruntime_onnx"', kind=kind, optimization=optimization)
    return OnnxRuntimeBackend(_repo(folder, f"cnn_{len(list(folder.iterdir()))}", config, CNN / "1/model.onnx"))


def tensorrt_backend(folder: Path, precision: str) -> Any:
    from workers.backends.tensorrt import TensorRTBackend
    from workers.offline.tensorrt_build import BatchRange, BuildSettings, build_engine

    plan = folder / f"cnn_{precision}.plan"
    began = time.perf_counter()
    plan.write_bytes(build_engine(CNN / "1/model.onnx", BuildSettings(precision, (BatchRange(1, 8, 64),))))
    print(f"  built the {precision} engine in {time.perf_counter() - began:.1f} s", flush=True)
    config = CONFIG.format(platform='platform: "tensorrt_plan"', kind="KIND_GPU", optimization="")
    model = folder / "model.plan"
    shutil.copy(plan, model)
    return TensorRTBackend(_repo(folder, f"cnn_trt_{precision.lower()}", config, model))


def measure(infer: Infer, images: np.ndarray, seconds: float) -> tuple[float, float]:
    """(images/s, median ms per call) after two warm-up calls."""
    for _ in range(2):
        infer(images)
    latencies: list[float] = []
    began = time.perf_counter()
    while len(latencies) < 3 or time.perf_counter() - began < seconds:
        start = time.perf_counter()
        infer(images)
        latencies.append(time.perf_counter() - start)
    elapsed = time.perf_counter() - began
    return len(latencies) * images.shape[0] / elapsed, float(np.median(latencies)) * 1e3


def run_backend(path: str, precision: str, make: Callable[[], Any], batches: Sequence[int], seconds: float,
                reference: dict[int, np.ndarray], inputs: dict[int, np.ndarray]) -> list[Row]:
    try:
        backend = make()
        backend.load()
    except Exception as err:  # the check reports and carries on  # noqa: BLE001
        return [Row(path, precision, None, "failed", f"load: {type(err).__name__}: {err}")]
    rows = []
    try:
        for batch in batches:
            rows.append(_one_batch(path, precision, backend, batch, seconds, reference, inputs))
    finally:
        backend.unload()
    return rows


def _one_batch(path: str, precision: str, backend: Any, batch: int, seconds: float,
               reference: dict[int, np.ndarray], inputs: dict[int, np.ndarray]) -> Row:
    def infer(images: np.ndarray) -> np.ndarray:
        return backend.infer({"IMAGE": images})["PROBS"]

    try:
        error = float(np.max(np.abs(infer(inputs[batch]) - reference[batch]))) if reference else None
        rate, p50 = measure(infer, inputs[batch], seconds)
    except Exception as err:  # noqa: BLE001
        return Row(path, precision, batch, "failed", f"{type(err).__name__}: {err}")
    ok = error is None or error <= TOLERANCE[precision]
    reason = "" if ok else f"max |difference| {error:.3g} > {TOLERANCE[precision]:g} against the CPU"
    return Row(path, precision, batch, "ok" if ok else "mismatch", reason, error, rate, p50)


def cuda_memory_check() -> dict[str, Any]:
    from workers.backends.cuda_memory import DeviceBuffer, Stream

    stream, buffer = Stream(0), DeviceBuffer("check")
    try:
        sent = np.random.default_rng(0).random(16 << 20, dtype=np.float32)  # 64 MiB
        back = np.empty_like(sent)
        buffer.upload(sent, stream)
        buffer.download(back, stream)
        stream.synchronize()
        same = bool(np.array_equal(sent, back))
        began = time.perf_counter()
        for _ in range(5):
            buffer.upload(sent, stream)
        stream.synchronize()
        up = 5 * sent.nbytes / (time.perf_counter() - began) / 1e9
        began = time.perf_counter()
        for _ in range(5):
            buffer.download(back, stream)
        stream.synchronize()
        down = 5 * sent.nbytes / (time.perf_counter() - began) / 1e9
        return {"status": "ok" if same else "mismatch", "round_trip_equal": same, "bytes": sent.nbytes,
                "host_to_device_GBps": round(up, 2), "device_to_host_GBps": round(down, 2)}
    except Exception as err:  # noqa: BLE001
        return {"status": "failed", "reason": f"{type(err).__name__}: {err}"}
    finally:
        buffer.close()
        stream.close()


# --- the run ----------------------------------------------------------------------

GPU_RUNS = (
    ("tensorrt", "FP32"), ("tensorrt", "FP16"),
    ("ort-tensorrt", "FP32"), ("ort-tensorrt", "FP16"),
    ("ort-cuda", "FP32"), ("ort-cuda", "FP16"),
)


def check(batches: Sequence[int], seconds: float, env: dict[str, Any]) -> tuple[list[Row], dict[str, Any]]:
    rng = np.random.default_rng(0)
    inputs = {batch: rng.random((batch, *IMAGE), dtype=np.float32) for batch in batches}
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print("running onnxruntime on the CPU (reference)", flush=True)
        cpu = run_backend("cpu", "FP32", lambda: ort_backend(folder, "KIND_CPU"), batches, seconds, {}, inputs)
        rows += cpu
        reference = {batch: ort_cpu(inputs[batch]) for batch in batches}
        for path, precision in GPU_RUNS:
            why = skip_reason(path, env)
            if why is None and path == "ort-cuda" and precision == "FP16":
                why = "the CUDA provider runs the model's own precision (FP32); FP16 needs an FP16 ONNX model"
            if why is not None:
                rows.append(Row(path, precision, None, "skipped", why))
                continue
            print(f"running {path} {precision}", flush=True)
            rows += run_backend(path, precision, _maker(path, precision, folder), batches, seconds, reference, inputs)
    why = skip_reason("cuda-memory", env)
    memory = {"status": "skipped", "reason": why} if why else cuda_memory_check()
    _ratios(rows)
    return rows, memory


def ort_cpu(images: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(CNN / "1/model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(["PROBS"], {"IMAGE": images})[0]


def _maker(path: str, precision: str, folder: Path) -> Callable[[], Any]:
    if path == "tensorrt":
        return lambda: tensorrt_backend(folder, precision)
    if path == "ort-tensorrt":
        return lambda: ort_backend(folder, "KIND_GPU", ORT_TENSORRT % precision)
    return lambda: ort_backend(folder, "KIND_GPU")


def _ratios(rows: list[Row]) -> None:
    cpu = {row.batch: row.images_per_s for row in rows if row.path == "cpu" and row.images_per_s}
    for row in rows:
        if row.images_per_s and cpu.get(row.batch):
            row.ratio_to_cpu = row.images_per_s / cpu[row.batch]


def table(rows: Sequence[Row], memory: dict[str, Any]) -> str:
    head = f"{'path':<13} {'prec':<5} {'batch':>5} {'status':<8} {'max|err|':>9} {'img/s':>9} {'p50 ms':>8} {'x cpu':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = [f"{r.path:<13} {r.precision:<5} {r.batch if r.batch is not None else '-':>5} {r.status:<8}",
                 f"{r.max_abs_err:9.2g}" if r.max_abs_err is not None else f"{'-':>9}",
                 f"{r.images_per_s:9.1f}" if r.images_per_s else f"{'-':>9}",
                 f"{r.p50_ms:8.2f}" if r.p50_ms else f"{'-':>8}",
                 f"{r.ratio_to_cpu:6.1f}" if r.ratio_to_cpu else f"{'-':>6}"]
        lines.append(" ".join(cells) + (f"  {r.reason}" if r.reason else ""))
    lines.append(f"cuda-memory: {json.dumps(memory)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--seconds", type=float, default=1.0, help="measuring time per path and batch size")
    parser.add_argument("--batches", default="1,8,64")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    env = environment()
    print(json.dumps(env, indent=2), flush=True)
    rows, memory = check(batches, args.seconds, env)
    print(table(rows, memory))
    args.out.write_text(json.dumps({"environment": env, "batches": batches, "seconds": args.seconds,
                                    "rows": [asdict(r) for r in rows], "cuda_memory": memory}, indent=2))
    print(f"wrote {args.out}")
    failed = [r for r in rows if r.status in ("failed", "mismatch")] + ([memory] if memory["status"] in
                                                                       ("failed", "mismatch") else [])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
