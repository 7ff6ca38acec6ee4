"""The two request bodies of ``bench_cpu.py`` and the ONNX ``Identity`` models that answer them,
written into a throw-away model repository: the model does next to nothing, so what a request
costs is what the server around it costs.

Without ``batching`` a model has ``max_batch_size: 0`` and a request's tensor is exactly the
payload's dims (16 FP32s; one 3x224x224 FP16 image), each request one ONNX Runtime call. With
it, ``max_batch_size: 64`` and ``dynamic_batching { }`` (no queue delay): a request carries
``[1, *dims]`` and requests that wait together run as one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from benchmarks.loadgen import TensorSpec
from tests.models import generator

INPUT, OUTPUT = "INPUT", "OUTPUT"
MAX_BATCH_SIZE = 64


@dataclass(frozen=True, slots=True)
class Payload:
    key: str                    # what ``--sizes`` and the JSON call it
    model: str
    datatype: str               # V2 datatype
    dims: tuple[int, ...]       # one request's tensor, batch dim aside
    onnx_type: int
    config_type: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.dims)) * np.dtype(self.numpy_dtype).itemsize

    @property
    def numpy_dtype(self) -> str:
        return {"FP32": "float32", "FP16": "float16"}[self.datatype]

    @property
    def label(self) -> str:
        dims = "x".join(str(d) for d in self.dims)
        size = f"{self.nbytes / 1000:.0f} KB" if self.nbytes >= 1000 else f"{self.nbytes} B"
        return f"{dims} {self.datatype} ({size})"

    def tensor(self, batching: bool) -> TensorSpec:
        shape = (1, *self.dims) if batching else self.dims
        data = np.random.default_rng(1).standard_normal(shape).astype(self.numpy_dtype)
        return TensorSpec(INPUT, self.datatype, shape, data.tobytes())


SMALL = Payload("small", "identity_fp32", "FP32", (16,), TensorProto.FLOAT, "TYPE_FP32")
LARGE = Payload("large", "identity_fp16", "FP16", (3, 224, 224), TensorProto.FLOAT16, "TYPE_FP16")
HUGE = Payload("huge", "identity_fp32_4mb", "FP32", (1024, 1024), TensorProto.FLOAT, "TYPE_FP32")
PAYLOADS = (SMALL, LARGE, HUGE)
DEFAULT_SIZES = (SMALL.key, LARGE.key)  # huge (4 MB, past the claim-check threshold) when asked for


def write_identity_models(repository: Path, batching: bool) -> None:
    """One ``onnxruntime_onnx`` model per payload: ``OUTPUT = Identity(INPUT)``, one CPU instance."""
    gen = generator()
    for payload in PAYLOADS:
        graph = helper.make_graph(
            [helper.make_node("Identity", [INPUT], [OUTPUT], name="identity")], payload.model,
            [gen.value_info(INPUT, payload.onnx_type, payload.dims, batching)],
            [gen.value_info(OUTPUT, payload.onnx_type, payload.dims, batching)],
        )
        model_dir = repository / payload.model
        gen.write_onnx_model(model_dir, gen.make_onnx_model(graph))
        gen.write_config(model_dir, gen.model_config(
            payload.model, 'platform: "onnxruntime_onnx"', MAX_BATCH_SIZE if batching else 0,
            [gen.tensor_config(INPUT, payload.config_type, payload.dims)],
            [gen.tensor_config(OUTPUT, payload.config_type, payload.dims)],
            ("dynamic_batching { }\n" if batching else "") + gen.cpu_instances(1),
        ))
