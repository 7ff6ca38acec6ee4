"""Build a TensorRT engine (``model.plan``) from an ONNX file.

    python -m workers.offline.tensorrt_build model.onnx model.plan --precision FP16 \\
        --batch 1:8:64 [--batch 65:128:256]

Each ``--batch MIN:OPT:MAX`` adds one optimization profile over dimension 0
of every input; the other dimensions must be fixed in the ONNX file. FP16
lets TensorRT choose half-precision kernels (I/O stays as the ONNX file has
it, usually FP32). INT8 needs calibration batches for the one input (random
ones if none are given, which serves a smoke test, not accuracy) and keeps
FP16 as the fallback for layers without INT8 kernels.

An engine runs only on the TensorRT version and GPU model that built it, so
build it on the machine that serves it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorrt as trt

from workers.errors import ModelLoadError

PRECISIONS = ("FP32", "FP16", "INT8")


@dataclass(frozen=True, slots=True)
class BatchRange:
    min: int
    opt: int
    max: int

    @classmethod
    def parse(cls, text: str) -> BatchRange:
        low, opt, high = (int(part) for part in text.split(":"))
        if not 1 <= low <= opt <= high:
            raise ValueError(f"batch range {text} must satisfy 1 <= MIN <= OPT <= MAX")
        return cls(low, opt, high)


@dataclass(frozen=True, slots=True)
class BuildSettings:
    precision: str = "FP32"
    batches: tuple[BatchRange, ...] = (BatchRange(1, 8, 64),)
    workspace_bytes: int = 1 << 30
    calibration: tuple[np.ndarray, ...] = ()  # INT8 only: batches for the one input


def build_engine(onnx_file: Path, settings: BuildSettings) -> bytes:
    """The serialized engine; ModelLoadError naming the file when TensorRT refuses."""
    if settings.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {settings.precision!r}")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_file.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ModelLoadError(f"{onnx_file}: TensorRT could not parse it: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_bytes)
    profiles = [_profile(builder, network, batch, onnx_file) for batch in settings.batches]
    for profile in profiles:
        config.add_optimization_profile(profile)
    calibrator = _set_precision(config, network, settings, profiles[0])
    serialized = builder.build_serialized_network(network, config)
    del calibrator  # kept alive until the build has read every batch
    if serialized is None:
        raise ModelLoadError(f"{onnx_file}: TensorRT could not build an engine; see its log above")
    return bytes(serialized)


def _profile(builder: trt.Builder, network: trt.INetworkDefinition, batch: BatchRange,
             onnx_file: Path) -> trt.IOptimizationProfile:
    profile = builder.create_optimization_profile()
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        rest = tuple(tensor.shape)[1:]
        if any(dim < 0 for dim in rest):
            raise ModelLoadError(f"{onnx_file}: input '{tensor.name}' has variable dimensions beyond the batch "
                                 f"({list(tensor.shape)}); fix them in the ONNX file first")
        profile.set_shape(tensor.name, (batch.min, *rest), (batch.opt, *rest), (batch.max, *rest))
    return profile


def _set_precision(config: trt.IBuilderConfig, network: trt.INetworkDefinition, settings: BuildSettings,
                   profile: trt.IOptimizationProfile) -> object | None:
    if settings.precision in ("FP16", "INT8"):
        config.set_flag(trt.BuilderFlag.FP16)
    if settings.precision != "INT8":
        return None
    if network.num_inputs != 1:
        raise ValueError("INT8 calibration here feeds one input; quantize a multi-input model beforehand (Q/DQ)")
    tensor = network.get_input(0)
    batches = settings.calibration or _random_batches(tuple(tensor.shape)[1:], settings.batches[0].opt)
    calibrator = _Calibrator(batches)
    config.set_flag(trt.BuilderFlag.INT8)
    config.int8_calibrator = calibrator
    config.set_calibration_profile(profile)
    return calibrator


def _random_batches(rest: tuple[int, ...], batch: int, count: int = 4) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    return tuple(rng.random((batch, *rest), dtype=np.float32) for _ in range(count))


class _Calibrator(trt.IInt8EntropyCalibrator2):
    """Feeds calibration batches to TensorRT from one device buffer."""

    def __init__(self, batches: Sequence[np.ndarray]) -> None:
        trt.IInt8EntropyCalibrator2.__init__(self)
        from workers.backends.cuda_memory import DeviceBuffer, Stream

        self._batch_size = int(batches[0].shape[0])
        self._batches: Iterator[np.ndarray] = iter(batches)
        self._stream = Stream(0)
        self._buffer = DeviceBuffer("calibration")

    def get_batch_size(self) -> int:
        return self._batch_size

    def get_batch(self, names: list[str]) -> list[int] | None:
        batch = next(self._batches, None)
        if batch is None:
            self._buffer.close()
            self._stream.close()
            return None
        self._buffer.upload(batch.astype(np.float32), self._stream)
        self._stream.synchronize()
        return [self._buffer.address]

    def read_calibration_cache(self) -> bytes | None:
        return None

    def write_calibration_cache(self, cache: object) -> None:
        return None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("onnx", type=Path)
    parser.add_argument("plan", type=Path)
    parser.add_argument("--precision", default="FP32", type=str.upper, choices=PRECISIONS)
    parser.add_argument("--batch", action="append", type=BatchRange.parse, metavar="MIN:OPT:MAX",
                        help="one optimization profile over the batch dimension (repeatable; default 1:8:64)")
    parser.add_argument("--workspace-bytes", type=int, default=1 << 30)
    args = parser.parse_args(argv)
    settings = BuildSettings(args.precision, tuple(args.batch or (BatchRange(1, 8, 64),)), args.workspace_bytes)
    args.plan.write_bytes(build_engine(args.onnx, settings))
    print(f"wrote {args.plan} ({args.precision}, profiles {[f'{b.min}:{b.opt}:{b.max}' for b in settings.batches]})")


if __name__ == "__main__":
    main()
