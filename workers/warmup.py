"""Running a model version's ``model_warmup`` samples before it reports ready.

Each sample is sent ``count`` times through the runner, as a request would
be, so a model that fails its warmup never takes traffic: the load fails with
a ``ModelLoadError`` naming the sample.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import structlog

from broker.envelope import Request, WireTensor
from workers.datatypes import decode_array, element_count, join_bytes, numpy_dtype
from workers.errors import ModelLoadError
from workers.repository.config import ModelConfig
from workers.repository.safe_paths import inside
from workers.repository.warmup_config import WARMUP_DIR, WarmupInput, WarmupSample
from workers.responder import Runner

log = structlog.get_logger("ferry.warmup")


async def warm_up(runner: Runner) -> None:
    """Run every warmup sample; ``ModelLoadError`` names the first that fails."""
    config = runner.config
    for sample in config.model_warmup:
        where = f"model '{runner.entry.name}' version {runner.version}: warmup sample '{sample.name}'"
        if config.sequence_batching is not None:
            raise ModelLoadError(f"{where}: ferry does not warm up models with sequence_batching")
        try:
            inputs = sample_tensors(config, sample, runner.entry.path)
            for run in range(sample.runs):
                await _run(runner, Request(id=f"warmup-{sample.name}-{run}", model=runner.entry.name,
                                           inputs=inputs, reply_to="", model_version=str(runner.version)))
        except Exception as exc:
            raise ModelLoadError(f"{where} failed: {exc}") from exc
        log.info("model.warmed_up", model=runner.entry.name, version=runner.version, sample=sample.name,
                 runs=sample.runs)


async def _run(runner: Runner, request: Request) -> None:
    if runner.config.decoupled:
        async for _ in runner.respond_stream(request):
            pass
        return
    await runner.respond(request)


def sample_tensors(config: ModelConfig, sample: WarmupSample, model_dir: Path) -> tuple[WireTensor, ...]:
    batched = config.max_batch_size > 0
    if not batched and sample.batch_size > 1:
        raise ValueError(f"batch_size {sample.batch_size} for a model that does not batch (max_batch_size 0)")
    if batched and sample.batch_size > config.max_batch_size:
        raise ValueError(f"batch_size {sample.batch_size} exceeds max_batch_size {config.max_batch_size}")
    lead = (max(1, sample.batch_size),) if batched else ()
    return tuple(_tensor(name, spec, lead + spec.dims, model_dir) for name, spec in sample.inputs.items())


def _tensor(name: str, spec: WarmupInput, shape: tuple[int, ...], model_dir: Path) -> WireTensor:
    count = element_count(shape)
    if spec.input_data_file:
        path = inside(model_dir / WARMUP_DIR, spec.input_data_file)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"input '{name}': cannot read {WARMUP_DIR}/{spec.input_data_file}: "
                             f"{exc.strerror}") from None
        decode_array(name, spec.datatype, shape, data)  # the size must fill the shape
    elif spec.datatype == "BYTES":
        data = join_bytes([_random_text() if spec.random_data else b""] * count)
    elif spec.random_data:
        data = _random(spec.datatype, count)
    else:
        data = np.zeros(count, dtype=numpy_dtype(spec.datatype)).tobytes()
    return WireTensor(name=name, datatype=spec.datatype, shape=shape, data=data)


def _random(datatype: str, count: int) -> bytes:
    dtype = numpy_dtype(datatype)
    rng = np.random.default_rng()
    if datatype == "BOOL":
        return rng.integers(0, 2, count).astype(dtype).tobytes()
    if dtype.kind in "iu":
        return rng.integers(0, 100, count).astype(dtype).tobytes()
    return rng.random(count).astype(dtype).tobytes()


def _random_text() -> bytes:
    return str(np.random.default_rng().integers(0, 1_000_000)).encode()
