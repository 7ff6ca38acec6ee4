"""Tree models (backend "fil") through a real ``ferry serve``, driven by tritonclient.

Each model is trained in the set-up, written in Triton's FIL layout, and every
served result is compared with the training library's own predict.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.servers import ferry_serve, free_port
from tests.tree_models import FEATURES, TrainedTree, sample, train_models, write_tree_model

SERVED = {  # model name -> (trained model, predict_proba, output dims)
    "xgb_binary": ("xgb_binary", True, 1),
    "xgb_multiclass": ("xgb_multiclass", True, 3),
    "xgb_regressor": ("xgb_regressor", False, 1),
    "lgb_binary": ("lgb_binary", True, 2),
    "lgb_multiclass_ids": ("lgb_multiclass", False, 1),
    "rf_binary": ("rf_binary", True, 2),
    "rf_regressor": ("rf_regressor", False, 1),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TrainedTree]:
    return train_models(tmp_path_factory.mktemp("train"))


@pytest.fixture(scope="module")
def repository(models, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    for name, (trained, proba, dims) in SERVED.items():
        write_tree_model(repo, name, models[trained], predict_proba=proba, output_dims=dims)
    pickled = write_tree_model(repo, "pickled_forest", models["rf_binary"])
    (pickled / "1" / "forest.pkl").write_bytes(pickle.dumps({"not": "loaded"}))
    config = pickled / "config.pbtxt"
    config.write_text(config.read_text() + 'default_model_filename: "forest.pkl"\n')
    return repo


@pytest.fixture(scope="module")
def url(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("logs") / "ferry.log"
    with ferry_serve(repository, log_path=log) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def client(url: str):
    triton = httpclient.InferenceServerClient(url)
    yield triton
    triton.close()


def infer(client: httpclient.InferenceServerClient, model: str, features: np.ndarray,
          datatype: str = "FP32") -> np.ndarray:
    tensor = httpclient.InferInput("input__0", list(features.shape), datatype)
    tensor.set_data_from_numpy(features, binary_data=True)
    result = client.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput("output__0")])
    return result.as_numpy("output__0")


def expected(models: dict[str, TrainedTree], name: str, features: np.ndarray) -> np.ndarray:
    trained, proba, dims = SERVED[name]
    tree = models[trained]
    scores = tree.predict(features)
    if not tree.classifier:
        return scores
    if proba:
        return np.hstack([1 - scores, scores]) if scores.shape[1] == 1 and dims == 2 else scores
    return np.argmax(scores, axis=1).astype(np.float32).reshape(-1, 1)


@pytest.mark.parametrize("name", list(SERVED))
@pytest.mark.parametrize("rows", [1, 37])
def test_served_outputs_match_the_library(client, models, name, rows):
    features = sample(rows, seed=11)
    if not name.startswith("rf_"):
        features[::3, 2] = np.nan   # missing values, routed as XGBoost and LightGBM route them
    out = infer(client, name, features)
    _, _, dims = SERVED[name]
    assert out.dtype == np.float32 and out.shape == (rows, dims)
    np.testing.assert_allclose(out, expected(models, name, features), rtol=1e-4, atol=1e-5)


def test_metadata_shows_the_fil_tensors(client):
    metadata = client.get_model_metadata("xgb_binary")
    assert metadata["inputs"] == [{"name": "input__0", "datatype": "FP32", "shape": [-1, FEATURES]}]
    assert metadata["outputs"][0]["name"] == "output__0"
    assert client.get_model_config("rf_binary")["backend"] == "fil"


def test_concurrent_requests_each_get_their_own_rows(url, models):
    batches = [sample(n, seed=20 + n) for n in range(1, 13)]
    parallel = httpclient.InferenceServerClient(url, concurrency=6)
    try:
        pending = []
        for features in batches:
            tensor = httpclient.InferInput("input__0", list(features.shape), "FP32")
            tensor.set_data_from_numpy(features, binary_data=True)
            pending.append(parallel.async_infer("xgb_multiclass", [tensor]))
        outputs = [request.get_result(timeout=30).as_numpy("output__0") for request in pending]
    finally:
        parallel.close()
    for features, out in zip(batches, outputs):
        np.testing.assert_allclose(out, models["xgb_multiclass"].predict(features), rtol=1e-4, atol=1e-5)


def test_a_wrong_feature_count_is_a_400_and_the_server_keeps_serving(client, models):
    with pytest.raises(InferenceServerException) as caught:
        infer(client, "lgb_binary", np.zeros((2, FEATURES + 3), np.float32))
    assert caught.value.status() == "400"
    assert "input__0" in caught.value.message() and str(FEATURES) in caught.value.message()
    features = sample(4, seed=12)
    np.testing.assert_allclose(infer(client, "lgb_binary", features), expected(models, "lgb_binary", features),
                               rtol=1e-4, atol=1e-5)


def test_a_wrong_datatype_is_a_400_and_the_server_keeps_serving(client, models):
    with pytest.raises(InferenceServerException) as caught:
        infer(client, "rf_binary", sample(2).astype(np.float64), datatype="FP64")
    assert caught.value.status() == "400"
    assert "FP64" in caught.value.message() and "FP32" in caught.value.message()
    features = sample(3, seed=13)
    np.testing.assert_allclose(infer(client, "rf_binary", features), expected(models, "rf_binary", features),
                               rtol=1e-4, atol=1e-5)


def test_a_pickle_named_as_the_model_file_is_refused_with_the_reason(client):
    rows = {row["name"]: row for row in client.get_model_repository_index()}
    assert rows["pickled_forest"]["state"] == "UNAVAILABLE"
    assert "pickle, which ferry never loads" in rows["pickled_forest"]["reason"]
    assert not client.is_model_ready("pickled_forest")
    assert client.is_model_ready("rf_binary")


def test_a_pickle_under_a_model_file_name_is_refused_at_load(models, tmp_path):
    """Such a model fails its load (so the server is live, never ready) and the log says why."""
    write_tree_model(tmp_path / "repo", "disguised", models["xgb_binary"])
    (tmp_path / "repo/disguised/1/xgboost.json").write_bytes(pickle.dumps(["trees"]))
    log = tmp_path / "ferry.log"
    port = free_port()
    command = [sys.executable, "-m", "ferry.cli.main", "serve", "--model-repository", str(tmp_path / "repo"),
               "--http-port", str(port), "--host", "127.0.0.1", "--log-format", "json", "--grpc-port", "0"]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=sink, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        failure = _wait_for_load_failure(log, process, time.monotonic() + 60)
        assert "looks like a Python pickle; ferry never unpickles models" in failure["error"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=5) as response:
            assert response.status == 200
    finally:
        process.terminate()
        process.wait(timeout=15)


def _wait_for_load_failure(log: Path, process: subprocess.Popen[bytes], deadline: float) -> dict[str, str]:
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{") and json.loads(line).get("event") == "worker.load_failed":
                time.sleep(0.5)   # let the HTTP side come up before the live check
                return json.loads(line)
        time.sleep(0.1)
    raise AssertionError(f"no worker.load_failed in the log:\n{log.read_text()}")
