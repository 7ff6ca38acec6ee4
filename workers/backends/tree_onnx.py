"""A Treelite model as an ONNX graph, so ONNX Runtime's tree-ensemble kernel runs it.

One converter for every model type Treelite reads (XGBoost, LightGBM, Treelite
checkpoints of scikit-learn forests): the trees become one
``ai.onnx.ml.TreeEnsembleRegressor`` giving margins ``[n, k]``, and the
model's postprocessor (sigmoid, softmax...) runs in numpy after it.

Thresholds stay exact although the kernel compares in float32: inputs are
float32, so ``x <= t`` holds exactly when ``x <= t32`` with ``t32`` the largest
float32 not above ``t`` (and ``x < t`` when ``x < t32``, ``t32`` the smallest
float32 not below ``t``). Missing values (NaN) follow each node's default
direction. Categorical splits have no ONNX form and are refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_MODES = {"<": "BRANCH_LT", "<=": "BRANCH_LEQ", ">": "BRANCH_GT", ">=": "BRANCH_GTE"}
# Round towards the side that keeps the comparison's outcome for every float32 input.
_ROUND_DOWN = {"<=", ">"}


class UnsupportedTrees(Exception):
    """The model has a feature the ONNX tree kernel cannot express."""


@dataclass(slots=True)
class _Ensemble:
    nodes: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in (
        "treeids", "nodeids", "featureids", "values", "modes", "truenodeids", "falsenodeids",
        "missing_value_tracks_true")})
    targets: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in (
        "treeids", "nodeids", "ids", "weights")})


def convert(model: Any) -> tuple[Any, Callable[[np.ndarray], np.ndarray], int]:
    """(ONNX model, postprocessor of its margins, feature count) for a ``treelite.Model``."""
    dump = json.loads(model.dump_as_json())
    if dump["num_target"] != 1:
        raise UnsupportedTrees("multi-target models")
    classes = int(dump["num_class"][0])
    ensemble = _Ensemble()
    for tree_id, tree in enumerate(dump["trees"]):
        if tree.get("has_categorical_split"):
            raise UnsupportedTrees("categorical splits")
        _add_tree(ensemble, tree_id, tree, int(dump["class_id"][tree_id]), classes)
    average = bool(dump["average_tree_output"])
    if average and classes > 1 and any(int(c) != -1 for c in dump["class_id"]):
        raise UnsupportedTrees("averaged trees that each score one class")
    graph = _graph(ensemble, dump["num_feature"], classes, [float(b) for b in dump["base_scores"]], average)
    return graph, _postprocessor(dump), int(dump["num_feature"])


def _add_tree(ensemble: _Ensemble, tree_id: int, tree: dict[str, Any], class_id: int, classes: int) -> None:
    nodes, targets = ensemble.nodes, ensemble.targets
    for node in tree["nodes"]:
        nodes["treeids"].append(tree_id)
        nodes["nodeids"].append(node["node_id"])
        if "leaf_value" in node:
            nodes["featureids"].append(0)
            nodes["values"].append(0.0)
            nodes["modes"].append("LEAF")
            nodes["truenodeids"].append(0)
            nodes["falsenodeids"].append(0)
            nodes["missing_value_tracks_true"].append(0)
            for target, weight in _leaf_targets(node["leaf_value"], class_id, classes):
                targets["treeids"].append(tree_id)
                targets["nodeids"].append(node["node_id"])
                targets["ids"].append(target)
                targets["weights"].append(weight)
            continue
        if node.get("node_type") != "numerical_test_node":
            raise UnsupportedTrees(f"{node.get('node_type')} nodes")
        op = node["comparison_op"]
        nodes["featureids"].append(node["split_feature_id"])
        nodes["values"].append(float32_threshold(float(node["threshold"]), op))
        nodes["modes"].append(_MODES[op])
        nodes["truenodeids"].append(node["left_child"])
        nodes["falsenodeids"].append(node["right_child"])
        nodes["missing_value_tracks_true"].append(int(bool(node["default_left"])))


def _leaf_targets(value: Any, class_id: int, classes: int) -> list[tuple[int, float]]:
    if isinstance(value, list):
        if len(value) == 1:
            return [(max(class_id, 0), float(value[0]))]
        return [(index, float(v)) for index, v in enumerate(value) if v != 0.0]
    return [(class_id if class_id >= 0 and classes > 1 else 0, float(value))]


def float32_threshold(threshold: float, op: str) -> float:
    """The float32 threshold that decides every float32 input as ``threshold`` does."""
    rounded = np.float32(threshold)
    if float(rounded) == threshold or np.isinf(rounded):
        return float(rounded)
    too_high = float(rounded) > threshold
    if op in _ROUND_DOWN and too_high:
        rounded = np.nextafter(rounded, np.float32(-np.inf))
    elif op not in _ROUND_DOWN and not too_high:
        rounded = np.nextafter(rounded, np.float32(np.inf))
    return float(rounded)


def _graph(ensemble: _Ensemble, features: int, classes: int, base: list[float], average: bool) -> Any:
    from onnx import TensorProto, helper

    nodes, targets = ensemble.nodes, ensemble.targets
    attributes: dict[str, Any] = {
        "n_targets": classes, "aggregate_function": "AVERAGE" if average else "SUM", "post_transform": "NONE",
        "base_values": base if any(base) else None,
        **{f"nodes_{k}": v for k, v in nodes.items()},
        **{f"target_{k}": v for k, v in targets.items()},
    }
    tree = helper.make_node("TreeEnsembleRegressor", ["input"], ["margin"], domain="ai.onnx.ml", **attributes)
    graph = helper.make_graph(
        [tree], "trees",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, features])],
        [helper.make_tensor_value_info("margin", TensorProto.FLOAT, [None, classes])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("ai.onnx.ml", 3)])


def _postprocessor(dump: dict[str, Any]) -> Callable[[np.ndarray], np.ndarray]:
    name = dump["postprocessor"]
    alpha = np.float32(dump.get("sigmoid_alpha", 1.0))
    if name in ("identity", "identity_multiclass"):
        return lambda margin: margin
    if name == "sigmoid":
        return lambda margin: (1.0 / (1.0 + np.exp(-alpha * margin))).astype(np.float32)
    if name == "softmax":
        return _softmax
    if name == "exponential":
        return lambda margin: np.exp(margin).astype(np.float32)
    raise UnsupportedTrees(f"the '{name}' postprocessor")


def _softmax(margin: np.ndarray) -> np.ndarray:
    shifted = np.exp(margin - margin.max(axis=1, keepdims=True))
    return (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)
