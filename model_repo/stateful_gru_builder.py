"""``stateful_gru``: a GRU step whose hidden state the sequence batcher keeps, and the
checks that it is one: batched against alone, and against a numpy GRU."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from model_files import cpu_instances, make_onnx_model, model_config, tensor_config, value_info

GRU_SEED = 20240602
GRU_MAX_BYTES = 50 * 1024
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

