"""PyTorch backend check: a small ResNet-style CNN served as TorchScript on
KIND_GPU (or KIND_CPU with --device cpu) in FP32 and FP16, checked against
ONNX Runtime on the CPU, and its throughput at a few batch sizes.

    python benchmarks/gpu_pytorch.py --out gpu_pytorch.json [--device cuda|cpu]
                                     [--batches 1,8,32] [--seconds 2] [--image 96]

For each precision:

    check     the backend's outputs for one batch against ONNX Runtime (CPU
              provider) running the FP32 module exported with torch.onnx.export;
              the largest difference must stay within 1e-3 (FP32; cuDNN may use
              TF32) or 3e-2 (FP16) of the largest logit.
    backend   PyTorchBackend.infer called in a loop at each batch size.
    runner    ferry's ModelRunner (validation, dynamic batcher, executor
              thread) at each batch size, 4 requests in flight. Skipped with
              the reason when ferry's runner cannot be imported here.

The baseline for ratios is the same module run eagerly with torch in this
process (no ferry code), at the same batch size and precision. Exit status 1
when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workers.backends.base import ModelContext  # noqa: E402
from workers.backends.pytorch import PyTorchBackend  # noqa: E402
from workers.repository.config_file import load_config  # noqa: E402

CLASSES = 100
TOLERANCE = {"FP32": 1e-3, "FP16": 3e-2}
IN_FLIGHT = 4


class Block(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.skip = (nn.Sequential(nn.Conv2d(channels_in, channels_out, 1, stride, bias=False),
                                   nn.BatchNorm2d(channels_out))
                     if stride != 1 or channels_in != channels_out else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))


class SmallResNet(nn.Module):
    """About 2.8M parameters: a stem, four stages of two blocks, a classifier."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(20240701)
        widths = (32, 64, 128, 192)
        layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU()]
        previous = 32
        for index, width in enumerate(widths):
            layers += [Block(previous, width, 1 if index == 0 else 2), Block(width, width, 1)]
            previous = width
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(previous, CLASSES)
        for module in self.modules():  # non-trivial batch-norm statistics, as a trained model has
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(image))


def config_text(name: str, datatype: str, image: int, kind: str, max_batch: int) -> str:
    return f"""
name: "{name}"
backend: "pytorch"
max_batch_size: {max_batch}
input [{{ name: "INPUT__0" data_type: TYPE_{datatype} dims: [ 3, {image}, {image} ] }}]
output [{{ name: "OUTPUT__0" data_type: TYPE_{datatype} dims: [ {CLASSES} ] }}]
dynamic_batching {{ max_queue_delay_microseconds: 500 }}
instance_group [ {{ count: 1 kind: {kind} {"gpus: [ 0 ]" if kind == "KIND_GPU" else ""} }} ]
"""


def write_model(root: Path, name: str, module: nn.Module, example: torch.Tensor, config: str) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        torch.jit.trace(module, example).save(str(root / name / "1" / "model.pt"))
    return root / name


def onnx_reference(module: nn.Module, images: np.ndarray, image: int) -> np.ndarray:
    import onnxruntime as ort

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.zeros(1, 3, image, image),), buffer, dynamo=False, opset_version=17,
                          input_names=["IMAGE"], output_names=["LOGITS"],
                          dynamic_axes={"IMAGE": {0: "batch"}, "LOGITS": {0: "batch"}})
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    return session.run(["LOGITS"], {"IMAGE": images})[0]


def backend_for(model_dir: Path) -> PyTorchBackend:
    config = load_config(model_dir / "config.pbtxt",
                         _parse(model_dir / "config.pbtxt") | {"default_model_filename": "model.pt"})
    backend = PyTorchBackend(ModelContext(name=config.name, version=1, version_dir=model_dir / "1",
                                          model_file=model_dir / "1" / "model.pt", config=config,
                                          instance=config.instance_groups[0]))
    backend.load()
    return backend


def _parse(path: Path) -> dict[str, Any]:
    from workers.repository.pbtxt import parse_file

    return parse_file(path)


def check(outputs: np.ndarray, reference: np.ndarray, precision: str) -> dict[str, Any]:
    difference = np.abs(outputs.astype(np.float32) - reference)
    scale = float(np.abs(reference).max())
    limit = TOLERANCE[precision] * scale  # relative to the largest logit
    return {"max_abs_diff": float(difference.max()), "reference_max_abs": scale, "limit": limit,
            "ok": bool(difference.max() <= limit and np.isfinite(outputs.astype(np.float32)).all())}


def rate(call: Callable[[], Any], rows: int, seconds: float, sync: Callable[[], None]) -> float:
    """Rows per second of ``call`` run back to back for ``seconds`` after a
    warm-up, on a thread of its own as the runner's executor runs it (torch's
    CPU speed differs between the main thread and others)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_rate, call, rows, seconds, sync).result()


def _rate(call: Callable[[], Any], rows: int, seconds: float, sync: Callable[[], None]) -> float:
    for _ in range(3):
        call()
    sync()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        call()
        count += 1
    sync()
    return count * rows / (time.perf_counter() - start)


def runner_rate(model_dir: Path, images: np.ndarray, seconds: float) -> float | str:
    try:
        from broker.envelope import Request, WireTensor
        from workers.datatypes import encode_array
        from workers.repository.layout import ModelRepository
        from workers.runner import ModelRunner
    except ImportError as err:
        return f"skipped: {err}"
    entry = ModelRepository(model_dir.parent).entry(model_dir.name)
    datatype, data = encode_array(images)
    request = Request(id="bench", model=model_dir.name, reply_to="",
                      inputs=(WireTensor("INPUT__0", datatype, images.shape, data),))

    async def measure() -> float:
        runner = ModelRunner(entry, 1)
        await runner.start()
        try:
            for _ in range(3):
                await runner.infer(request)
            done, stop = 0, time.perf_counter() + seconds

            async def loop() -> None:
                nonlocal done
                while time.perf_counter() < stop:
                    await runner.infer(request)
                    done += 1
            start = time.perf_counter()
            await asyncio.gather(*(loop() for _ in range(IN_FLIGHT)))
            return done * images.shape[0] / (time.perf_counter() - start)
        finally:
            await runner.aclose()
    return asyncio.run(measure())


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but torch.cuda.is_available() is False (use --device cpu)")
    kind = "KIND_GPU" if device.type == "cuda" else "KIND_CPU"
    batches = [int(b) for b in args.batches.split(",")]
    module = SmallResNet().eval()
    images = np.random.default_rng(0).standard_normal((max(batches), 3, args.image, args.image), dtype=np.float32)
    reference = onnx_reference(module, images[:8], args.image)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    report: dict[str, Any] = {"device": _device_name(device), "torch": torch.__version__, "image": args.image,
                              "parameters": sum(p.numel() for p in module.parameters()), "rows": []}
    root = Path(tempfile.mkdtemp(prefix="ferry-gpu-pytorch-"))
    for precision, dtype in (("FP32", torch.float32), ("FP16", torch.float16)):
        typed = SmallResNet().eval().to(dtype)
        np_dtype = np.float32 if dtype == torch.float32 else np.float16
        model_dir = write_model(root, f"resnet_{precision.lower()}", typed,
                                torch.zeros(1, 3, args.image, args.image, dtype=dtype),
                                config_text(f"resnet_{precision.lower()}", precision, args.image, kind, max(batches)))
        backend = backend_for(model_dir)
        checked = check(backend.infer({"INPUT__0": images[:8].astype(np_dtype)})["OUTPUT__0"], reference, precision)
        report.setdefault("checks", {})[precision] = checked
        eager = typed.to(device)
        for rows in batches:
            batch = images[:rows].astype(np_dtype)

            def eager_call() -> None:  # the same copies in and out as the backend makes
                with torch.inference_mode():
                    eager(torch.from_numpy(batch).to(device)).cpu()
            row = {"precision": precision, "batch": rows,
                   "eager_torch": rate(eager_call, rows, args.seconds, sync),
                   "backend": rate(lambda: backend.infer({"INPUT__0": batch}), rows, args.seconds, sync)}
            row["runner"] = runner_rate(model_dir, batch, args.seconds)
            report["rows"].append(row)
        backend.unload()
    return report


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"


def print_table(report: dict[str, Any]) -> None:
    print(f"device: {report['device']}  torch {report['torch']}  image 3x{report['image']}x{report['image']}  "
          f"{report['parameters']:,} parameters")
    for precision, checked in report["checks"].items():
        verdict = "ok" if checked["ok"] else "FAILED"
        print(f"check {precision}: max |ferry - onnxruntime cpu| = {checked['max_abs_diff']:.2e} "
              f"(limit {checked['limit']:.2e}, logits up to {checked['reference_max_abs']:.2f}): {verdict}")
    print(f"{'precision':<9} {'batch':>5} {'eager torch/s':>14} {'backend/s':>11} {'ratio':>6} "
          f"{'runner/s':>10} {'ratio':>6}")
    for row in report["rows"]:
        runner = row["runner"]
        runner_text = (f"{runner:>10.1f} {runner / row['eager_torch']:>6.2f}" if isinstance(runner, float)
                       else f"{'-':>10} {'-':>6}")
        print(f"{row['precision']:<9} {row['batch']:>5} {row['eager_torch']:>14.1f} {row['backend']:>11.1f} "
              f"{row['backend'] / row['eager_torch']:>6.2f} {runner_text}")
    skipped = {row["runner"] for row in report["rows"] if isinstance(row["runner"], str)}
    for reason in skipped:
        print(f"runner: {reason}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON report to write")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per row and path")
    parser.add_argument("--image", type=int, default=96, help="image side in pixels")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    report = run(args)
    print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0 if all(checked["ok"] for checked in report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
