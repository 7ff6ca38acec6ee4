"""Write ferry's example model repository, deterministically.

    python model_repo/generate.py [--out DIR]

writes ``add_sub``, ``cnn`` and ``text_stats`` (``config.pbtxt`` plus
``1/model.onnx`` or ``1/model.py``) under DIR, by default the folder this
script lives in. Every weight comes from a fixed seed and every file is
serialised the same way each run, so regenerating leaves the committed files
byte for byte unchanged.

The builders (``build_add_sub``, ``add_sub_config``, ``tensor_config``,
``write_onnx_model``...) are also used by the test helpers in
``tests/models.py``, which load this file by path.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
PRODUCER = "ferry-model-repo"
CNN_SEED = 20240601
CNN_MAX_BYTES = 400 * 1024

# --- shared builders -------------------------------------------------------


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


def tensor_config(name: str, config_type: str, dims: Sequence[int]) -> str:
    """One entry of a ``config.pbtxt`` ``input`` or ``output`` list."""
    dim_text = ", ".join(str(d) for d in dims)
    return f'  {{ name: "{name}" data_type: {config_type} dims: [ {dim_text} ] }}'


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


# --- add_sub ---------------------------------------------------------------


def build_add_sub(size: int = 16, batched: bool = True) -> onnx.ModelProto:
    fp32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
        ],
        "add_sub",
        [value_info(n, fp32, [size], batched) for n in ("INPUT0", "INPUT1")],
        [value_info(n, fp32, [size], batched) for n in ("OUTPUT0", "OUTPUT1")],
    )
    return make_onnx_model(graph)


def add_sub_config(
    name: str = "add_sub", max_batch_size: int = 8, delay_us: int = 100, instances: int = 1, size: int = 16,
) -> str:
    """Without batching (``max_batch_size`` 0) there is no dynamic batcher either."""
    batching = f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n" if max_batch_size > 0 else ""
    return model_config(
        name, 'platform: "onnxruntime_onnx"', max_batch_size,
        [tensor_config(n, "TYPE_FP32", [size]) for n in ("INPUT0", "INPUT1")],
        [tensor_config(n, "TYPE_FP32", [size]) for n in ("OUTPUT0", "OUTPUT1")],
        batching + cpu_instances(instances),
    )


def write_add_sub(repo: Path, name: str = "add_sub", max_batch_size: int = 8,
                  delay_us: int = 100, instances: int = 1) -> None:
    model_dir = repo / name
    write_onnx_model(model_dir, build_add_sub(batched=max_batch_size > 0))
    write_config(model_dir, add_sub_config(name, max_batch_size, delay_us, instances))


# --- cnn -------------------------------------------------------------------


class ConvSpec(NamedTuple):
    in_channels: int
    out_channels: int
    stride: int


IMAGE_CHANNELS, IMAGE_SIZE, CLASSES, KERNEL = 3, 128, 10, 3

# Most of the compute sits at full and half resolution where channels are
# few; the channel-heavy layers run on small maps, which keeps the weights
# small (about 91k parameters) for about 160 million MACs per image.
CNN_LAYERS = (
    ConvSpec(3, 16, 1),
    ConvSpec(16, 16, 1),
    ConvSpec(16, 32, 2),
    ConvSpec(32, 32, 1),
    ConvSpec(32, 64, 2),
    ConvSpec(64, 64, 1),
    ConvSpec(64, 32, 2),
)


class CnnStats(NamedTuple):
    parameters: int
    macs_per_image: int


def cnn_stats(layers: Sequence[ConvSpec] = CNN_LAYERS) -> CnnStats:
    """Parameters and multiply-accumulates of the convolutions and the Gemm."""
    size, params, macs = IMAGE_SIZE, 0, 0
    for layer in layers:
        size = (size + 2 - KERNEL) // layer.stride + 1
        weights = layer.out_channels * layer.in_channels * KERNEL * KERNEL
        params += weights + layer.out_channels
        macs += weights * size * size
    features = layers[-1].out_channels
    return CnnStats(params + features * CLASSES + CLASSES, macs + features * CLASSES)


def he_normal(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def build_cnn(seed: int = CNN_SEED, layers: Sequence[ConvSpec] = CNN_LAYERS) -> onnx.ModelProto:
    """An untrained classifier: He-initialised weights and zero biases from a
    fixed seed. It exists to give the server real compute, not right answers."""
    rng = np.random.default_rng(seed)
    nodes, weights, current = [], [], "IMAGE"
    for index, layer in enumerate(layers):
        w, b, conv, relu = f"conv{index}_w", f"conv{index}_b", f"conv{index}", f"relu{index}"
        fan_in = layer.in_channels * KERNEL * KERNEL
        weights.append(numpy_helper.from_array(
            he_normal(rng, (layer.out_channels, layer.in_channels, KERNEL, KERNEL), fan_in), w))
        weights.append(numpy_helper.from_array(np.zeros(layer.out_channels, np.float32), b))
        nodes.append(helper.make_node("Conv", [current, w, b], [conv], name=conv, kernel_shape=[KERNEL, KERNEL],
                                      pads=[1, 1, 1, 1], strides=[layer.stride, layer.stride]))
        nodes.append(helper.make_node("Relu", [conv], [relu], name=relu))
        current = relu
    features = layers[-1].out_channels
    weights.append(numpy_helper.from_array(he_normal(rng, (CLASSES, features), features), "fc_w"))
    weights.append(numpy_helper.from_array(np.zeros(CLASSES, np.float32), "fc_b"))
    nodes += [
        helper.make_node("GlobalAveragePool", [current], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["PROBS"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "cnn",
        [value_info("IMAGE", TensorProto.FLOAT, [IMAGE_CHANNELS, IMAGE_SIZE, IMAGE_SIZE], True)],
        [value_info("PROBS", TensorProto.FLOAT, [CLASSES], True)],
        initializer=weights,
    )
    return make_onnx_model(graph)


def cnn_config(name: str = "cnn") -> str:
    return model_config(
        name, 'platform: "onnxruntime_onnx"', 64,
        [tensor_config("IMAGE", "TYPE_FP32", [IMAGE_CHANNELS, IMAGE_SIZE, IMAGE_SIZE])],
        [tensor_config("PROBS", "TYPE_FP32", [CLASSES])],
        "dynamic_batching {\n  preferred_batch_size: [ 16, 32, 64 ]\n  max_queue_delay_microseconds: 2000\n}\n"
        + cpu_instances(1),
    )


def check_cnn(path: Path) -> None:
    """Batch 8 must agree row for row with batch 1, and each row sum to one."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    images = np.random.default_rng(0).standard_normal((8, IMAGE_CHANNELS, IMAGE_SIZE, IMAGE_SIZE), np.float32)
    batched = session.run(["PROBS"], {"IMAGE": images})[0]
    single = np.concatenate([session.run(["PROBS"], {"IMAGE": images[i:i + 1]})[0] for i in range(8)])
    if batched.shape != (8, CLASSES) or not np.allclose(batched, single, rtol=0, atol=1e-5):
        raise SystemExit(f"{path}: batch 8 disagrees with batch 1 (max diff {np.abs(batched - single).max()})")
    if not np.allclose(batched.sum(axis=1), 1.0, rtol=0, atol=1e-5):
        raise SystemExit(f"{path}: softmax rows do not sum to 1: {batched.sum(axis=1)}")


# --- text_stats ------------------------------------------------------------

TEXT_STATS_SOURCE = '''\
"""text_stats: upper-cases UTF-8 text and counts its unicode characters.

TEXT (BYTES [1]) -> UPPER (BYTES [1], UTF-8), LENGTH (INT32 [1], code points).
Generated by model_repo/generate.py; edit it there.
"""

import numpy as np


def _decode(element):
    return bytes(element).decode("utf-8")


def _upper_utf8(text):
    return text.upper().encode("utf-8")


# Element-wise ufuncs over object arrays; numpy's fixed-width string dtypes
# would drop trailing NULs and cannot grow a string that upper-casing
# lengthens ("\\u00df" -> "SS").
_DECODE = np.frompyfunc(_decode, 1, 1)
_UPPER_UTF8 = np.frompyfunc(_upper_utf8, 1, 1)
_LENGTH = np.frompyfunc(len, 1, 1)


class Model:
    def load(self, context):
        pass

    def infer(self, inputs):
        text = np.asarray(inputs["TEXT"], dtype=object)
        try:
            decoded = _DECODE(text)
        except UnicodeDecodeError as exc:
            raise ValueError(f"input 'TEXT' is not valid UTF-8: {exc.reason} at byte {exc.start}") from None
        upper = np.asarray(_UPPER_UTF8(decoded), dtype=object)
        length = np.asarray(_LENGTH(decoded), dtype=object).astype(np.int32)
        return {"UPPER": upper, "LENGTH": length}

    def unload(self):
        pass
'''


def text_stats_config(name: str = "text_stats") -> str:
    return model_config(
        name, 'backend: "python"', 16,
        [tensor_config("TEXT", "TYPE_STRING", [1])],
        [tensor_config("UPPER", "TYPE_STRING", [1]), tensor_config("LENGTH", "TYPE_INT32", [1])],
        "dynamic_batching { }\n" + cpu_instances(1),
    )


# --- the repository --------------------------------------------------------


def generate(out: Path) -> None:
    write_add_sub(out)
    cnn_path = write_onnx_model(out / "cnn", build_cnn())
    write_config(out / "cnn", cnn_config())
    write_python_source(out / "text_stats", TEXT_STATS_SOURCE)
    write_config(out / "text_stats", text_stats_config())
    check_cnn(cnn_path)
    stats, size = cnn_stats(), cnn_path.stat().st_size
    if size > CNN_MAX_BYTES:
        raise SystemExit(f"{cnn_path}: {size} bytes, over the {CNN_MAX_BYTES} byte budget")
    print(f"cnn: {stats.parameters} parameters, {size} bytes, {stats.macs_per_image / 1e6:.1f}M MACs per image")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="repository folder to write (default: this script's folder)")
    args = parser.parse_args(argv)
    generate(args.out)
    print(f"wrote add_sub, cnn, text_stats under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
