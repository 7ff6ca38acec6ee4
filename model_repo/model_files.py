"""What every generated model is made of: an ONNX model and its graph's inputs and
outputs, the text of a ``config.pbtxt``, and the files of Triton's layout they go into.

Each is serialised the same way every run, so regenerating leaves the files byte
for byte unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import helper

OPSET = 17
IR_VERSION = 8
PRODUCER = "ferry-model-repo"


def make_onnx_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER,
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def value_info(name: str, elem_type: int, dims: Sequence[int], batched: bool) -> onnx.ValueInfoProto:
    """A graph input/output; ``-1`` in ``dims`` and the batch dim become symbolic."""
    shape: list[int | str] = ["batch"] if batched else []
    shape += [f"{name}_d{i}" if d == -1 else d for i, d in enumerate(dims)]
    return helper.make_tensor_value_info(name, elem_type, shape)


def tensor_config(name: str, config_type: str, dims: Sequence[int], extra: str = "") -> str:
    """One entry of a ``config.pbtxt`` ``input`` or ``output`` list (``extra``: more fields)."""
    dim_text = ", ".join(str(d) for d in dims)
    more = f" {extra}" if extra else ""
    return f'  {{ name: "{name}" data_type: {config_type} dims: [ {dim_text} ]{more} }}'


def model_config(
    name: str,
    engine: str,
    max_batch_size: int,
    inputs: Sequence[str],
    outputs: Sequence[str],
    extra: str = "",
) -> str:
    """A ``config.pbtxt``; ``engine`` is the ``platform: ...`` or ``backend: ...`` line."""
    separator = ",\n"
    return (
        f'name: "{name}"\n{engine}\nmax_batch_size: {max_batch_size}\n'
        f"input [\n{separator.join(inputs)}\n]\n"
        f"output [\n{separator.join(outputs)}\n]\n"
        f"{extra}"
    )


def cpu_instances(count: int) -> str:
    return f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n"


def write_config(model_dir: Path, text: str) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text, encoding="utf-8", newline="\n")


def write_onnx_model(model_dir: Path, model: onnx.ModelProto, version: int = 1) -> Path:
    version_dir = model_dir / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    path = version_dir / "model.onnx"
    path.write_bytes(model.SerializeToString(deterministic=True))
    return path


def write_python_source(model_dir: Path, source: str, version: int = 1) -> Path:
    version_dir = model_dir / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    path = version_dir / "model.py"
    path.write_text(source, encoding="utf-8", newline="\n")
    return path

