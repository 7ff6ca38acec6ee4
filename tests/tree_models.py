"""Tiny tree models trained on the spot, written in Triton's FIL layout.

    models = train_models()                         # {name: TrainedTree}
    write_tree_model(repo, name, tree, params=..., output_dims=1)

Each ``TrainedTree`` keeps the library's own predict, the reference every
served result is compared with (scikit-learn's from the fitted estimator in
memory; the repository only ever holds its Treelite checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workers.offline.trees_export import export_sklearn

FEATURES = 8
ROWS = 200
TREES = 20


@dataclass(frozen=True, slots=True)
class TrainedTree:
    model_type: str
    filename: str
    data: bytes
    classes: int            # the columns the library's probabilities have (1: binary or regression)
    classifier: bool
    predict: Callable[[np.ndarray], np.ndarray]  # the library's own: probabilities or values, [n, classes]


def sample(rows: int = ROWS, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, FEATURES)).astype(np.float32)


def _labels(features: np.ndarray, classes: int) -> np.ndarray:
    score = features[:, 0] + 0.5 * features[:, 1] - features[:, 2] * features[:, 3]
    return np.digitize(score, np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1]))


def _columns(values: np.ndarray, rows: int) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).reshape(rows, -1)


def _read(path: Path) -> bytes:
    data = path.read_bytes()
    path.unlink()
    return data


def train_models(scratch: Path) -> dict[str, TrainedTree]:
    import lightgbm
    import xgboost
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

    x = sample()
    x[::17, 4] = np.nan   # missing values in training, so trees learn a default direction
    binary, three = _labels(np.nan_to_num(x), 2), _labels(np.nan_to_num(x), 3)
    models: dict[str, TrainedTree] = {}

    xgb_bin = xgboost.XGBClassifier(n_estimators=TREES, max_depth=3, n_jobs=1).fit(x, binary).get_booster()
    xgb_bin.save_model(scratch / "xgb_bin.json")
    models["xgb_binary"] = TrainedTree("xgboost_json", "xgboost.json", _read(scratch / "xgb_bin.json"), 1, True,
                                       lambda f: _columns(xgb_bin.inplace_predict(f), len(f)))
    xgb_multi = xgboost.XGBClassifier(n_estimators=TREES, max_depth=3, n_jobs=1).fit(x, three).get_booster()
    xgb_multi.save_model(scratch / "xgb_multi.ubj")
    models["xgb_multiclass"] = TrainedTree("xgboost_ubj", "xgboost.ubj", _read(scratch / "xgb_multi.ubj"), 3,
                                           True, lambda f: _columns(xgb_multi.inplace_predict(f), len(f)))
    xgb_reg = xgboost.XGBRegressor(n_estimators=TREES, max_depth=3, n_jobs=1).fit(x, x[:, 0] * 2).get_booster()
    xgb_reg.save_model(scratch / "xgb_reg.ubj")   # XGBoost >= 2.1 writes UBJSON as xgboost.model too
    models["xgb_regressor"] = TrainedTree("xgboost", "xgboost.model", _read(scratch / "xgb_reg.ubj"), 1,
                                          False, lambda f: _columns(xgb_reg.inplace_predict(f), len(f)))

    params = {"n_estimators": TREES, "num_leaves": 8, "min_child_samples": 5, "verbose": -1, "n_jobs": 1}
    lgb_bin = lightgbm.LGBMClassifier(**params).fit(x, binary).booster_
    lgb_bin.save_model(scratch / "lgb_bin.txt")
    models["lgb_binary"] = TrainedTree("lightgbm", "model.txt", _read(scratch / "lgb_bin.txt"), 1, True,
                                       lambda f: _columns(lgb_bin.predict(f), len(f)))
    lgb_multi = lightgbm.LGBMClassifier(**params).fit(x, three).booster_
    lgb_multi.save_model(scratch / "lgb_multi.txt")
    models["lgb_multiclass"] = TrainedTree("lightgbm", "model.txt", _read(scratch / "lgb_multi.txt"), 3, True,
                                           lambda f: _columns(lgb_multi.predict(f), len(f)))

    clean = np.nan_to_num(x)
    rf = RandomForestClassifier(TREES, max_depth=5, random_state=0).fit(clean, binary)
    models["rf_binary"] = TrainedTree("treelite_checkpoint", "checkpoint.tl",
                                      _read(export_sklearn(rf, scratch / "rf.tl")), 2, True,
                                      lambda f: _columns(rf.predict_proba(f), len(f)))
    rf_multi = RandomForestClassifier(TREES, max_depth=5, random_state=0).fit(clean, three)
    models["rf_multiclass"] = TrainedTree("treelite_checkpoint", "checkpoint.tl",
                                          _read(export_sklearn(rf_multi, scratch / "rfm.tl")), 3, True,
                                          lambda f: _columns(rf_multi.predict_proba(f), len(f)))
    rf_reg = RandomForestRegressor(TREES, max_depth=5, random_state=0).fit(clean, clean[:, 0] * 2)
    models["rf_regressor"] = TrainedTree("treelite_checkpoint", "checkpoint.tl",
                                         _read(export_sklearn(rf_reg, scratch / "rfr.tl")), 1, False,
                                         lambda f: _columns(rf_reg.predict(f), len(f)))
    return models


def config_text(name: str, tree: TrainedTree, *, predict_proba: bool, output_dims: int | None = None,
                extra: dict[str, str] | None = None, max_batch_size: int = 512) -> str:
    dims = output_dims if output_dims is not None else (tree.classes if predict_proba else 1)
    params = {"model_type": tree.model_type, "output_class": str(tree.classifier).lower(),
              "predict_proba": str(predict_proba).lower(), **(extra or {})}
    entries = ",\n".join(f'  {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items())
    return (f'name: "{name}"\nbackend: "fil"\nmax_batch_size: {max_batch_size}\n'
            f'input [{{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }}]\n'
            f'output [{{ name: "output__0" data_type: TYPE_FP32 dims: [ {dims} ] }}]\n'
            f'instance_group [{{ kind: KIND_CPU }}]\nparameters [\n{entries}\n]\n'
            'dynamic_batching { max_queue_delay_microseconds: 500 }\n')


def write_tree_model(repo: Path, name: str, tree: TrainedTree, *, predict_proba: bool = True,
                     output_dims: int | None = None, extra: dict[str, str] | None = None) -> Path:
    """``repo/name/config.pbtxt`` and ``repo/name/1/<the model_type's file>``."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / tree.filename).write_bytes(tree.data)
    (repo / name / "config.pbtxt").write_text(
        config_text(name, tree, predict_proba=predict_proba, output_dims=output_dims, extra=extra))
    return repo / name
