"""Models whose answers prove which version computed them, for model control tests.

    write_add_version(repo, "adder", version=1, addend=1.0)   # OUTPUT0 = INPUT0 + 1
    write_warmup_model(repo, "warm", marker, fail=False)       # records its warmup runs
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.models import generator, write_python_model

ADD_CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: {{ latest {{ num_versions: 1 }} }}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 500 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def add_model_bytes(addend: float) -> bytes:
    gen = generator()
    constant = numpy_helper.from_array(np.full((4,), addend, dtype=np.float32), name="ADDEND")
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "ADDEND"], ["OUTPUT0"])], "adder",
        [gen.value_info("INPUT0", TensorProto.FLOAT, [4], True)],
        [gen.value_info("OUTPUT0", TensorProto.FLOAT, [4], True)],
        initializer=[constant],
    )
    return gen.make_onnx_model(graph).SerializeToString(deterministic=True)


def write_add_version(repo: Path, name: str, version: int, addend: float) -> None:
    """Version ``version`` of ``name`` adds ``addend``; the config keeps the latest version."""
    model_dir = repo / name
    (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(ADD_CONFIG.format(name=name), encoding="utf-8")
    staged = model_dir / f".{version}.onnx.tmp"
    staged.write_bytes(add_model_bytes(addend))
    staged.rename(model_dir / str(version) / "model.onnx")  # a poller never sees half a file


WARMUP_SOURCE = """
import os

import numpy as np

MARKER = {marker!r}
FAIL = {fail!r}


class Model:
    def infer(self, inputs):
        value = int(inputs["INPUT0"].reshape(-1)[0])
        if FAIL and value == 0:
            raise RuntimeError("zeros are not welcome")
        with open(MARKER, "a", encoding="utf-8") as out:
            out.write(str(value) + "\\n")
        return {{"OUTPUT0": (inputs["INPUT0"] * 2).astype(np.int32)}}
"""

WARMUP_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
model_warmup [ {{
  name: "{sample}"
  batch_size: 0
  count: 3
  inputs {{ key: "INPUT0" value: {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }} }}
}} ]
"""


def write_warmup_model(repo: Path, name: str, marker: Path, fail: bool = False, sample: str = "zeros") -> None:
    """A python model that appends each input to ``marker``; its warmup sends 0 three times
    (with ``fail``, a 0 raises, so the warmup fails the load)."""
    write_python_model(repo, name, WARMUP_SOURCE.format(marker=str(marker), fail=fail),
                       WARMUP_CONFIG.format(name=name, sample=sample))
