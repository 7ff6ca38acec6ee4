"""The fil backend on tiny real models: every runtime against the library's own predict."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from tests.tree_models import FEATURES, TrainedTree, sample, train_models, write_tree_model
from workers.backends.base import ModelContext
from workers.backends.tree_onnx import float32_threshold
from workers.backends.trees import AUTO_RUNTIMES, TreeBackend
from workers.errors import ConfigError, InvalidInput, ModelLoadError
from workers.repository.config import InstanceGroup
from workers.repository.layout import ModelRepository

RUNTIMES_FOR = {
    "xgboost": ("native", "gtil", "tl2cgen", "onnx"),
    "lightgbm": ("native", "gtil", "tl2cgen", "onnx"),
    "treelite_checkpoint": ("gtil", "tl2cgen", "onnx"),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TrainedTree]:
    return train_models(tmp_path_factory.mktemp("train"))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tl2cgen")


def backend_for(repo: Path, name: str) -> TreeBackend:
    entry = ModelRepository(repo).entry(name)
    context = ModelContext(name=name, version=1, version_dir=entry.path / "1", model_file=entry.model_file(1),
                           config=entry.config, instance=InstanceGroup(kind="KIND_CPU"))
    return TreeBackend(context)


def loaded(repo: Path, name: str) -> TreeBackend:
    backend = backend_for(repo, name)
    backend.load()
    return backend


def features_with_nan(rows: int = 64) -> np.ndarray:
    x = sample(rows, seed=3)
    x[::5, 4] = np.nan
    x[::7, 0] = np.nan
    return x


def family(model_type: str) -> str:
    return "xgboost" if model_type.startswith("xgboost") else model_type


CASES = [(name, runtime) for name in ("xgb_binary", "xgb_multiclass", "xgb_regressor", "lgb_binary",
                                      "lgb_multiclass", "rf_binary", "rf_multiclass", "rf_regressor")
         for runtime in ("auto", "native", "gtil", "tl2cgen", "onnx")]


@pytest.mark.parametrize(("name", "runtime"), CASES)
def test_every_runtime_matches_the_library(models, tmp_path, cache_dir, name, runtime):
    tree = models[name]
    if runtime != "auto" and runtime not in RUNTIMES_FOR[family(tree.model_type)]:
        pytest.skip(f"{runtime} does not serve {tree.model_type} models")
    write_tree_model(tmp_path, name, tree, predict_proba=tree.classifier,
                     extra={"runtime": runtime, "tl2cgen_cache_dir": str(cache_dir)})
    backend = loaded(tmp_path, name)
    x = features_with_nan(100) if family(tree.model_type) != "treelite_checkpoint" else sample(100, seed=3)
    for rows in (1, 7, 100):   # auto runs small and large XGBoost batches on different runtimes
        out = backend.infer({"input__0": x[:rows]})["output__0"]
        assert out.dtype == np.float32 and out.shape == (rows, tree.classes)
        np.testing.assert_allclose(out, tree.predict(x[:rows]), rtol=1e-4, atol=1e-5)
    backend.unload()


def test_class_ids_follow_the_threshold(models, tmp_path):
    tree = models["xgb_binary"]
    write_tree_model(tmp_path, "half", tree, predict_proba=False)
    write_tree_model(tmp_path, "strict", tree, predict_proba=False, extra={"threshold": "0.9"})
    x = sample(100, seed=4)
    probability = tree.predict(x)
    np.testing.assert_array_equal(loaded(tmp_path, "half").infer({"input__0": x})["output__0"],
                                  (probability > 0.5).astype(np.float32))
    strict = loaded(tmp_path, "strict").infer({"input__0": x})["output__0"]
    np.testing.assert_array_equal(strict, (probability > 0.9).astype(np.float32))
    assert 0 < strict.sum() < (probability > 0.5).sum()


def test_multiclass_class_ids_are_the_most_probable_class(models, tmp_path):
    tree = models["lgb_multiclass"]
    write_tree_model(tmp_path, "m", tree, predict_proba=False)
    x = sample(50, seed=5)
    out = loaded(tmp_path, "m").infer({"input__0": x})["output__0"]
    np.testing.assert_array_equal(out[:, 0], np.argmax(tree.predict(x), axis=1))


def test_a_binary_model_gives_two_columns_when_its_output_has_two(models, tmp_path):
    tree = models["lgb_binary"]
    write_tree_model(tmp_path, "two", tree, output_dims=2)
    x = sample(20, seed=6)
    out = loaded(tmp_path, "two").infer({"input__0": x})["output__0"]
    p = tree.predict(x)[:, 0]
    np.testing.assert_allclose(out, np.stack([1 - p, p], axis=1), rtol=1e-4, atol=1e-5)


def test_the_model_file_follows_model_type(models, tmp_path):
    for name in ("xgb_binary", "xgb_multiclass", "xgb_regressor", "lgb_binary", "rf_binary"):
        write_tree_model(tmp_path, name, models[name])
        entry = ModelRepository(tmp_path).entry(name)
        assert entry.model_file(1).name == models[name].filename


def test_wrong_feature_count_is_invalid_input(models, tmp_path):
    config = write_tree_model(tmp_path, "m", models["xgb_binary"]) / "config.pbtxt"
    config.write_text(config.read_text().replace(f"dims: [ {FEATURES} ]", "dims: [ -1 ]"))
    backend = loaded(tmp_path, "m")
    with pytest.raises(InvalidInput, match=rf"input 'input__0'.*\[batch, {FEATURES}\]"):
        backend.infer({"input__0": np.zeros((2, FEATURES + 1), np.float32)})
    assert backend.infer({"input__0": np.zeros((2, FEATURES), np.float32)})["output__0"].shape == (2, 1)


def test_input_dims_that_disagree_with_the_model_fail_the_load(models, tmp_path):
    config = write_tree_model(tmp_path, "m", models["xgb_binary"]) / "config.pbtxt"
    config.write_text(config.read_text().replace(f"dims: [ {FEATURES} ]", "dims: [ 5 ]"))
    with pytest.raises(ModelLoadError, match=r"config.pbtxt: field 'input\[0\].dims'.*8 features"):
        loaded(tmp_path, "m")


def test_output_dims_that_disagree_with_the_classes_fail_the_load(models, tmp_path):
    write_tree_model(tmp_path, "m", models["lgb_multiclass"], output_dims=2)
    with pytest.raises(ModelLoadError, match=r"field 'output\[0\].dims': ends in 2, but the model gives 3"):
        loaded(tmp_path, "m")


@pytest.mark.parametrize(("key", "value", "field"), [
    ("runtime", "fastest", "parameters.runtime"),
    ("output_class", "maybe", "parameters.output_class"),
    ("threshold", "high", "parameters.threshold"),
    ("nthread", "0", "parameters.nthread"),
])
def test_bad_parameters_name_the_field(models, tmp_path, key, value, field):
    write_tree_model(tmp_path, "m", models["xgb_binary"], extra={key: value})
    with pytest.raises(ModelLoadError, match=rf"config.pbtxt: field '{field}'"):
        backend_for(tmp_path, "m")


def test_an_unknown_model_type_is_a_config_error(models, tmp_path):
    write_tree_model(tmp_path, "m", models["xgb_binary"], extra={"model_type": "catboost"})
    with pytest.raises(ConfigError, match="parameters.model_type.*'catboost' is unknown"):
        ModelRepository(tmp_path).entry("m")


def test_a_pickle_is_refused_even_under_a_model_name(models, tmp_path):
    write_tree_model(tmp_path, "m", models["xgb_binary"])
    (tmp_path / "m/1/xgboost.json").write_bytes(pickle.dumps({"trees": [1, 2, 3]}))
    backend = backend_for(tmp_path, "m")
    with pytest.raises(ModelLoadError, match="looks like a Python pickle; ferry never unpickles"):
        backend.load()


def test_a_pickle_file_name_is_refused_at_scan(models, tmp_path):
    config = write_tree_model(tmp_path, "m", models["rf_binary"]) / "config.pbtxt"
    config.write_text(config.read_text() + 'default_model_filename: "forest.pkl"\n')
    index = ModelRepository(tmp_path).scan()
    assert "m" in index.errors
    assert "pickle, which ferry never loads" in str(index.errors["m"])


def test_a_corrupt_model_file_fails_the_load_naming_it(models, tmp_path):
    write_tree_model(tmp_path, "m", models["lgb_binary"])
    (tmp_path / "m/1/model.txt").write_text("not a lightgbm model\n")
    with pytest.raises(ModelLoadError, match=r"m/1/model.txt: the .* runtime could not load"):
        loaded(tmp_path, "m")


def test_tl2cgen_reuses_its_compiled_library(models, tmp_path, cache_dir):
    write_tree_model(tmp_path, "m", models["rf_regressor"],
                     extra={"runtime": "tl2cgen", "tl2cgen_cache_dir": str(tmp_path / "cache")})
    loaded(tmp_path, "m").unload()
    built = sorted((tmp_path / "cache").glob("*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    loaded(tmp_path, "m").unload()
    assert sorted((tmp_path / "cache").glob("*.so")) == built and built[0].stat().st_mtime_ns == stamp


def test_auto_has_a_choice_for_every_model_type():
    from workers.backends.tree_runtimes import MODEL_FILENAMES

    assert set(AUTO_RUNTIMES) == set(MODEL_FILENAMES)


@pytest.mark.parametrize("op", ["<", "<=", ">", ">="])
def test_float32_thresholds_decide_every_float32_input_as_the_float64_one(op):
    import operator

    compare = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}[op]
    rng = np.random.default_rng(7)
    for threshold in [*rng.normal(size=200), 0.1, 1 / 3, 2.0, -0.0]:
        t32 = np.float32(float32_threshold(float(threshold), op))
        near = np.float32(threshold)
        for x in (np.nextafter(near, np.float32(-np.inf)), near, np.nextafter(near, np.float32(np.inf))):
            assert compare(float(x), float(threshold)) == compare(x, t32), (threshold, x, t32)
