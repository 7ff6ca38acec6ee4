"""TensorFlow SavedModels (``platform: "tensorflow_savedmodel"``) in ``ferry serve``: a small
Keras model and a string model, their configs completed from the signature, answered as
TensorFlow answers them run directly, and batched."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.servers import ferry_serve
from workers.errors import ConfigError
from workers.repository.savedmodel import read_savedmodel_signature

ROWS = np.random.default_rng(2).random((12, 4), dtype=np.float32)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The models, and what TensorFlow run directly answers for ``ROWS``, made by
    ``tests/tf_models.py`` in a process of its own (this one has PyTorch loaded)."""
    root = tmp_path_factory.mktemp("tf") / "repo"
    root.mkdir()
    np.save(root.parent / "rows.npy", ROWS)
    subprocess.run([sys.executable, "-m", "tests.tf_models", str(root), str(root.parent / "rows.npy"),
                    str(root.parent / "expected.npy")], check=True, cwd=ROOT, timeout=300)
    return root


@pytest.fixture(scope="module")
def url(repo: Path):
    with ferry_serve(repo) as served:
        yield served


def test_the_config_is_completed_from_the_signature(url: str) -> None:
    with httpclient.InferenceServerClient(url) as client:
        config = client.get_model_config("keras_dense")
    assert config["backend"] == "tensorflow" and config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("features", "TYPE_FP32", [4])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [("output_0", "TYPE_FP32", [3])]


def test_answers_are_tensorflows_own_and_concurrent_requests_batch(repo: Path, url: str) -> None:

    def ask(row: np.ndarray) -> np.ndarray:
        with httpclient.InferenceServerClient(url) as client:
            tensor = httpclient.InferInput("features", [1, 4], "FP32")
            tensor.set_data_from_numpy(row[None])
            return client.infer("keras_dense", [tensor]).as_numpy("output_0")

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(ask, ROWS))
    expected = np.load(repo.parent / "expected.npy")
    np.testing.assert_allclose(np.concatenate(answers), expected, rtol=1e-6, atol=1e-6)
    with httpclient.InferenceServerClient(url) as client:
        (row,) = client.get_inference_statistics("keras_dense")["model_stats"]
    assert row["inference_count"] == 12 and row["execution_count"] < 12


def test_a_named_signature_and_string_tensors(url: str) -> None:
    with httpclient.InferenceServerClient(url) as client:
        text = httpclient.InferInput("text", [3], "BYTES")
        text.set_data_from_numpy(np.array([b"ferry", b"", "δ".encode()], dtype=object))
        result = client.infer("text", [text])
    np.testing.assert_array_equal(result.as_numpy("length"), [5, 0, 2])
    assert list(result.as_numpy("upper")) == [b"FERRY", b"", "δ".encode()]


def test_the_signature_is_read_without_tensorflow_and_a_missing_one_is_named(repo: Path) -> None:
    signature = read_savedmodel_signature(repo / "text/1/model.savedmodel", "by_length")
    assert [(s.name, s.datatype, s.shape) for s in signature.inputs] == [("text", "BYTES", (-1,))]
    assert {s.name: s.datatype for s in signature.outputs} == {"length": "INT32", "upper": "BYTES"}
    with pytest.raises(ConfigError, match="no signature 'serving_default' \\(it has 'by_length'\\)"):
        read_savedmodel_signature(repo / "text/1/model.savedmodel")
