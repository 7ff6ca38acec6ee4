"""Small model repositories for tests, written into a directory they are given.

    write_identity_model(repo, name, datatypes, max_batch_size=8)
    write_python_model(repo, name, source, config_text)
    write_add_sub(repo, name="add_sub", max_batch_size=8, delay_us=100, instances=1)
    write_countdown_model(repo)
    write_recording_model(repo, name, record, poison=None, on_poison="raise", delay_s=0.0)
    recorded_values(record)
    write_slow_model(repo, name, sleep_s, computes="double", dims=(4,), max_batch_size=0, delay_us=None)
    write_slow_add_sub(repo, sleep_s, name="add_sub")

The ONNX builders come from ``model_repo/generate.py`` (loaded by path, as
``model_repo/`` is a folder of models, not a package), so the models tests
build are the same ones the committed repository holds.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
from onnx import TensorProto, helper

from workers.datatypes import to_config_name

GENERATOR_PATH = Path(__file__).resolve().parent.parent / "model_repo" / "generate.py"

# V2 datatype -> ONNX element type; onnxruntime's CPU Identity runs them all.
ONNX_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}
IDENTITY_DATATYPES = tuple(ONNX_TYPES)


@functools.cache
def generator() -> ModuleType:
    """``model_repo/generate.py`` as a module."""
    module_name = "ferry_model_repo_generate"
    spec = importlib.util.spec_from_file_location(module_name, GENERATOR_PATH)
    assert spec is not None and spec.loader is not None, GENERATOR_PATH
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def write_identity_model(repo: Path, name: str, datatypes: list[str], max_batch_size: int = 8) -> None:
    """``OUT_<DT> = IN_<DT>`` for each datatype, dims ``[-1]`` after the batch
    dim. Without batching (``max_batch_size`` 0) there is no dynamic batcher."""
    gen = generator()
    unknown = sorted(set(datatypes) - set(ONNX_TYPES))
    if unknown:
        raise ValueError(f"no identity model for datatypes {unknown}; choose from {list(ONNX_TYPES)}")
    batched = max_batch_size > 0
    graph = helper.make_graph(
        [helper.make_node("Identity", [f"IN_{dt}"], [f"OUT_{dt}"], name=f"identity_{dt}") for dt in datatypes],
        name,
        [gen.value_info(f"IN_{dt}", ONNX_TYPES[dt], [-1], batched) for dt in datatypes],
        [gen.value_info(f"OUT_{dt}", ONNX_TYPES[dt], [-1], batched) for dt in datatypes],
    )
    model_dir = repo / name
    gen.write_onnx_model(model_dir, gen.make_onnx_model(graph))
    gen.write_config(model_dir, gen.model_config(
        name, 'platform: "onnxruntime_onnx"', max_batch_size,
        [gen.tensor_config(f"IN_{dt}", to_config_name(dt), [-1]) for dt in datatypes],
        [gen.tensor_config(f"OUT_{dt}", to_config_name(dt), [-1]) for dt in datatypes],
        ("dynamic_batching { }\n" if batched else "") + gen.cpu_instances(1),
    ))


def write_python_model(repo: Path, name: str, source: str, config_text: str) -> None:
    model_dir = repo / name
    generator().write_python_source(model_dir, source)
    generator().write_config(model_dir, config_text)


def write_add_sub(repo: Path, name: str = "add_sub", max_batch_size: int = 8,
                  delay_us: int = 100, instances: int = 1) -> None:
    """The committed ``add_sub`` (FP32 [16] in, sum and difference out), renamed
    and re-batched as a test needs."""
    generator().write_add_sub(repo, name, max_batch_size, delay_us, instances)


# A decoupled python model: for N it answers N times, N down to 1, each
# response a moment after the last; a negative N fails the request.
COUNTDOWN = """
import time

import numpy as np


class Model:
    def infer(self, inputs):
        n = int(inputs["N"].reshape(-1)[0])
        if n < 0:
            raise ValueError("N must not be negative")
        for i in range(n, 0, -1):
            time.sleep(0.01)
            yield {"OUT": np.array([i], dtype=np.int32), "WORD": np.array([f"t-{i}".encode()], dtype=object)}
"""
COUNTDOWN_CONFIG = """
name: "countdown"
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "WORD" data_type: TYPE_STRING dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""


def write_countdown_model(repo: Path) -> None:
    write_python_model(repo, "countdown", COUNTDOWN, COUNTDOWN_CONFIG)


# A python model that sleeps ``sleep_s`` in each batch, so that work is still
# in flight when a test acts (a kill, a SIGTERM, a claim, a lag reading).
SLOW_MODEL = """
import time


class Model:
    def infer(self, inputs):
        time.sleep({sleep_s!r})
        return {outputs}
"""
# What a slow model computes -> (its inputs, its outputs, the expression of its outputs).
SLOW_COMPUTES = {
    "double": (("X",), ("Y",), '{"Y": inputs["X"] * 2}'),
    # A small answer to a large request.
    "head": (("X",), ("Y",), '{"Y": inputs["X"][:1]}'),
    # add_sub's names and answers (INPUT0 + INPUT1, INPUT0 - INPUT1).
    "add_sub": (("INPUT0", "INPUT1"), ("OUTPUT0", "OUTPUT1"),
                '{"OUTPUT0": inputs["INPUT0"] + inputs["INPUT1"], "OUTPUT1": inputs["INPUT0"] - inputs["INPUT1"]}'),
}


def write_slow_model(repo: Path, name: str, sleep_s: float, computes: str = "double", dims: tuple[int, ...] = (4,),
                     max_batch_size: int = 0, delay_us: int | None = None) -> None:
    """FP32 tensors of ``dims``; a dynamic batcher waiting ``delay_us`` when given."""
    inputs, outputs, expression = SLOW_COMPUTES[computes]
    gen = generator()
    batching = f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n" if delay_us is not None else ""
    config = gen.model_config(
        name, 'backend: "python"', max_batch_size,
        [gen.tensor_config(tensor, "TYPE_FP32", dims) for tensor in inputs],
        [gen.tensor_config(tensor, "TYPE_FP32", dims) for tensor in outputs],
        batching + gen.cpu_instances(1),
    )
    write_python_model(repo, name, SLOW_MODEL.format(sleep_s=sleep_s, outputs=expression), config)


def infer_slow_model(url: str, model: str, x: np.ndarray) -> np.ndarray:
    """``Y`` for ``X = x`` from a ``write_slow_model`` model (``double``), through tritonclient."""
    import tritonclient.http as httpclient

    tensor = httpclient.InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    client = httpclient.InferenceServerClient(url, network_timeout=120.0)
    try:
        return client.infer(model, [tensor]).as_numpy("Y")
    finally:
        client.close()


def write_slow_add_sub(repo: Path, sleep_s: float, name: str = "add_sub") -> None:
    """``add_sub`` (FP32 [16] in, sum and difference out, batches of up to 8) sleeping ``sleep_s`` a batch."""
    write_slow_model(repo, name, sleep_s, computes="add_sub", dims=(16,), max_batch_size=8, delay_us=2000)



# A python model that appends each input value it computes to a file, so a
# test can count computations across worker processes. One unbatched INT32
# [1] input, OUTPUT0 = 2 * INPUT0. On ``poison`` it raises RuntimeError
# ("raise") or kills its worker with os._exit(1) ("exit"), after recording:
# that one runs in the worker's process (FERRY_INSTANCE_PROCESS "no"), as
# in an instance process of its own it would kill only that.
RECORDING_MODEL = """
import os
import time

import numpy as np

RECORD = {record!r}
POISON = {poison!r}
ON_POISON = {on_poison!r}
DELAY_S = {delay_s!r}
POISON_ERROR = "poisoned input " + str(POISON)


class Model:
    def infer(self, inputs):
        value = int(inputs["INPUT0"].reshape(-1)[0])
        fd = os.open(RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (str(value) + "\\n").encode())
        finally:
            os.close(fd)
        if POISON is not None and value == POISON:
            if ON_POISON == "exit":
                os._exit(1)
            raise RuntimeError(POISON_ERROR)
        if DELAY_S:
            time.sleep(DELAY_S)
        return {{"OUTPUT0": (inputs["INPUT0"] * 2).astype(np.int32)}}
"""
RECORDING_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters [ {{ key: "FERRY_INSTANCE_PROCESS" value: {{ string_value: "{instance_process}" }} }} ]
"""


def write_recording_model(repo: Path, name: str, record: Path, poison: int | None = None,
                          on_poison: str = "raise", delay_s: float = 0.0) -> None:
    """Unbatched, so one request is exactly one ``infer`` call (a batch that
    fails would otherwise be rerun request by request, recording twice)."""
    if on_poison not in ("raise", "exit"):
        raise ValueError(f"on_poison must be 'raise' or 'exit', not {on_poison!r}")
    source = RECORDING_MODEL.format(record=str(record), poison=poison, on_poison=on_poison, delay_s=delay_s)
    config = RECORDING_CONFIG.format(name=name, instance_process="no" if on_poison == "exit" else "yes")
    write_python_model(repo, name, source, config)


def recorded_values(record: Path) -> list[int]:
    """Every value a recording model computed, in order; [] before the first."""
    if not record.exists():
        return []
    return [int(line) for line in record.read_text(encoding="utf-8").split()]


def poison_error(poison: int) -> str:
    """The message a recording model raises with on ``poison``."""
    return f"poisoned input {poison}"
