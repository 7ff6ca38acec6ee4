"""``cnn``: an untrained convolutional classifier that gives the server real compute."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from model_files import cpu_instances, make_onnx_model, model_config, tensor_config, value_info

CNN_SEED = 20240601
# Names for its classes (CIFAR-10's), for Triton's classification extension.
CNN_LABELS = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
LABELS_FILE = "labels.txt"
CNN_MAX_BYTES = 400 * 1024


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
        [tensor_config("PROBS", "TYPE_FP32", [CLASSES], f'label_filename: "{LABELS_FILE}"')],
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


def write_labels(model_dir: Path) -> None:
    (model_dir / LABELS_FILE).write_text("".join(f"{label}\n" for label in CNN_LABELS), encoding="utf-8")
