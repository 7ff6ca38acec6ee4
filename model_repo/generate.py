"""Write ferry's example model repository, deterministically.

    python model_repo/generate.py [--out DIR]

writes ``add_sub``, ``cnn``, ``stateful_gru`` and ``text_stats``
(``config.pbtxt`` plus ``1/model.onnx`` or ``1/model.py``) under DIR, by default the folder this
script lives in. Every weight comes from a fixed seed and every file is
serialised the same way each run, so regenerating leaves the committed files
byte for byte unchanged.

The builders (``build_add_sub``, ``add_sub_config``, ``tensor_config``,
``write_onnx_model``...) are also used by the test helpers in
``tests/models.py``, which load this file by path.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
PRODUCER = "ferry-model-repo"
CNN_SEED = 20240601
CNN_MAX_BYTES = 400 * 1024
GRU_SEED = 20240602
GRU_MAX_BYTES = 50 * 1024

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


# --- stateful_gru ----------------------------------------------------------

GRU_FEATURES, GRU_HIDDEN, GRU_CLASSES = 16, 32, 8
# The generator's check: 4 sequences of 5 steps, 3 frames a step.
GRU_SEQUENCES, GRU_STEPS, GRU_FRAMES = 4, 5, 3


def small_normal(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """Well under Xavier scale, so gate pre-activations stay near zero and
    the state stays well inside tanh's range over long sequences."""
    return (rng.standard_normal(shape) * 0.3 / np.sqrt(fan_in)).astype(np.float32)


def gru_weights(seed: int = GRU_SEED) -> dict[str, np.ndarray]:
    """ONNX GRU layout: one direction, gates stacked z, r, h; ``gru_b`` is
    the input biases then the recurrent ones."""
    rng = np.random.default_rng(seed)
    hidden, features = GRU_HIDDEN, GRU_FEATURES
    return {
        "gru_w": small_normal(rng, (1, 3 * hidden, features), features),
        "gru_r": small_normal(rng, (1, 3 * hidden, hidden), hidden),
        "gru_b": small_normal(rng, (1, 6 * hidden), hidden),
        "fc_w": small_normal(rng, (GRU_CLASSES, hidden), hidden),
        "fc_b": np.zeros(GRU_CLASSES, np.float32),
    }


def build_stateful_gru(seed: int = GRU_SEED) -> onnx.ModelProto:
    """One GRU step over a chunk of frames; the state goes in as HIDDEN_IN and
    comes back as HIDDEN_OUT for the sequence batcher to keep. Untrained."""
    weights = gru_weights(seed)
    initializers = [numpy_helper.from_array(value, name) for name, value in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([0], np.int64), "axis0"))
    # onnxruntime's CPU GRU rejects layout=1 ("Batchwise recurrent operations
    # are not supported"), so the graph keeps batch-major tensors at its edges
    # and runs the GRU time-major (layout=0) in between.
    nodes = [
        helper.make_node("Transpose", ["FEATURES"], ["frames_first"], name="time_major", perm=[1, 0, 2]),
        helper.make_node("Unsqueeze", ["HIDDEN_IN", "axis0"], ["initial_h"], name="initial_h"),
        helper.make_node("GRU", ["frames_first", "gru_w", "gru_r", "gru_b", "", "initial_h"], ["", "last_h"],
                         name="gru", hidden_size=GRU_HIDDEN, linear_before_reset=0),
        helper.make_node("Squeeze", ["last_h", "axis0"], ["HIDDEN_OUT"], name="hidden_out"),
        helper.make_node("Gemm", ["HIDDEN_OUT", "fc_w", "fc_b"], ["LOGITS"], name="fc", transB=1),
    ]
    fp32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "stateful_gru",
        [helper.make_tensor_value_info("FEATURES", fp32, ["batch", "frames", GRU_FEATURES]),
         value_info("HIDDEN_IN", fp32, [GRU_HIDDEN], True)],
        [value_info("HIDDEN_OUT", fp32, [GRU_HIDDEN], True), value_info("LOGITS", fp32, [GRU_CLASSES], True)],
        initializer=initializers,
    )
    return make_onnx_model(graph)


# The state tensors stay out of input/output: Triton's implicit state, which
# the sequence batcher feeds and collects itself.
GRU_SEQUENCE_BATCHING = f"""\
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  oldest {{
    max_candidate_sequences: 64
    preferred_batch_size: [ 8, 32 ]
    max_queue_delay_microseconds: 2000
  }}
  state [
    {{
      input_name: "HIDDEN_IN"
      output_name: "HIDDEN_OUT"
      data_type: TYPE_FP32
      dims: [ {GRU_HIDDEN} ]
      initial_state: {{ data_type: TYPE_FP32 dims: [ {GRU_HIDDEN} ] zero_data: true name: "zeros" }}
    }}
  ]
}}
"""


def stateful_gru_config(name: str = "stateful_gru") -> str:
    return model_config(
        name, 'platform: "onnxruntime_onnx"', 32,
        [tensor_config("FEATURES", "TYPE_FP32", [-1, GRU_FEATURES])],
        [tensor_config("LOGITS", "TYPE_FP32", [GRU_CLASSES])],
        GRU_SEQUENCE_BATCHING + cpu_instances(1),
    )


GruStep = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def run_gru_steps(step: GruStep, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Thread the state through ``features`` [steps, batch, frames, 16] from
    zeros, as the sequence batcher would; (LOGITS per step, last state)."""
    hidden = np.zeros((features.shape[1], GRU_HIDDEN), np.float32)
    logits = []
    for step_features in features:
        step_logits, hidden = step(step_features, hidden)
        logits.append(step_logits)
    return np.stack(logits), hidden


def onnx_gru_step(session: Any) -> GruStep:
    """A GruStep running an onnxruntime session of ``stateful_gru``."""
    def step(features: np.ndarray, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        logits, hidden_out = session.run(["LOGITS", "HIDDEN_OUT"], {"FEATURES": features, "HIDDEN_IN": hidden})
        return logits, hidden_out
    return step


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def reference_gru_step(weights: dict[str, np.ndarray], features: np.ndarray,
                       hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ONNX GRU equations (linear_before_reset=0), in float64."""
    w, r = weights["gru_w"][0].astype(np.float64), weights["gru_r"][0].astype(np.float64)
    wb, rb = np.split(weights["gru_b"][0].astype(np.float64), 2)
    h, state = GRU_HIDDEN, hidden.astype(np.float64)
    for t in range(features.shape[1]):
        x_gates, h_gates = features[:, t] @ w.T + wb, state @ r.T + rb
        z = sigmoid(x_gates[:, :h] + h_gates[:, :h])
        reset = sigmoid(x_gates[:, h:2 * h] + h_gates[:, h:2 * h])
        candidate = np.tanh(x_gates[:, 2 * h:] + (reset * state) @ r[2 * h:].T + rb[2 * h:])
        state = (1 - z) * candidate + z * state
    return state @ weights["fc_w"].T + weights["fc_b"], state


def _expect_close(path: Path, what: str, actual: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> None:
    for name, a, e in zip(("LOGITS", "final state"), actual, expected):
        if a.shape != e.shape or not np.allclose(a, e, rtol=0, atol=1e-5):
            diff = np.abs(a - e).max() if a.shape == e.shape else f"shapes {a.shape} vs {e.shape}"
            raise SystemExit(f"{path}: {what}: {name} disagree (max diff {diff})")


def check_stateful_gru(path: Path) -> None:
    """Each sequence run alone at batch 1 must match the four run as one
    batch, and a numpy GRU must match both, so the graph is a GRU whose rows
    keep to their own state."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    shape = (GRU_STEPS, GRU_SEQUENCES, GRU_FRAMES, GRU_FEATURES)
    features = np.random.default_rng(0).standard_normal(shape, np.float32)
    batched = run_gru_steps(onnx_gru_step(session), features)
    for i in range(GRU_SEQUENCES):
        alone = run_gru_steps(onnx_gru_step(session), features[:, i:i + 1])
        _expect_close(path, f"sequence {i} at batch 1 vs batched", alone, (batched[0][:, i:i + 1], batched[1][i:i + 1]))
    weights = {w.name: numpy_helper.to_array(w) for w in onnx.load(str(path)).graph.initializer}
    reference = run_gru_steps(functools.partial(reference_gru_step, weights), features)
    _expect_close(path, "numpy reference GRU vs onnxruntime", batched, reference)


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


def check_size(path: Path, max_bytes: int) -> int:
    size = path.stat().st_size
    if size > max_bytes:
        raise SystemExit(f"{path}: {size} bytes, over the {max_bytes} byte budget")
    return size


def generate(out: Path) -> None:
    write_add_sub(out)
    cnn_path = write_onnx_model(out / "cnn", build_cnn())
    write_config(out / "cnn", cnn_config())
    gru_path = write_onnx_model(out / "stateful_gru", build_stateful_gru())
    write_config(out / "stateful_gru", stateful_gru_config())
    write_python_source(out / "text_stats", TEXT_STATS_SOURCE)
    write_config(out / "text_stats", text_stats_config())
    check_cnn(cnn_path)
    check_stateful_gru(gru_path)
    stats, size = cnn_stats(), check_size(cnn_path, CNN_MAX_BYTES)
    print(f"cnn: {stats.parameters} parameters, {size} bytes, {stats.macs_per_image / 1e6:.1f}M MACs per image")
    print(f"stateful_gru: {check_size(gru_path, GRU_MAX_BYTES)} bytes")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="repository folder to write (default: this script's folder)")
    args = parser.parse_args(argv)
    generate(args.out)
    print(f"wrote add_sub, cnn, stateful_gru, text_stats under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
