from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.models import GENERATOR_PATH, IDENTITY_DATATYPES, generator, write_add_sub, write_identity_model
from workers.datatypes import numpy_dtype
from workers.repository.config import ModelConfig
from workers.repository.config_file import parse_config_file

MODEL_REPO = GENERATOR_PATH.parent
MODELS = ("add_sub", "cnn", "stateful_gru", "text_stats")
# Stateful models batch through the sequence batcher, the rest dynamically.
BATCHING = {"stateful_gru": "sequence_batching"}
GRU_PATH = MODEL_REPO / "stateful_gru" / "1" / "model.onnx"


def generated_files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for model in MODELS
        for path in sorted((root / model).rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def import_file(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"test_{path.parent.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def batching(config: ModelConfig, field: str) -> Any:
    """``field`` as parsed, whether ModelConfig models it or keeps it as an extra."""
    return getattr(config, field, None) or config.extras.get(field)


def test_generate_reproduces_the_committed_files_byte_for_byte(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(GENERATOR_PATH), "--out", str(tmp_path)], check=True, capture_output=True)
    fresh, committed = generated_files(tmp_path), generated_files(MODEL_REPO)
    assert sorted(fresh) == sorted(committed)
    changed = [name for name in fresh if fresh[name] != committed[name]]
    assert changed == [], f"regenerate with: python {GENERATOR_PATH.relative_to(MODEL_REPO.parent)}"


@pytest.mark.parametrize("model", MODELS)
def test_committed_configs_validate(model: str) -> None:
    config = parse_config_file(MODEL_REPO / model / "config.pbtxt")
    assert config.name == model
    assert batching(config, BATCHING.get(model, "dynamic_batching")) is not None


def test_cnn_weights_stay_under_400_kb() -> None:
    path = MODEL_REPO / "cnn" / "1" / "model.onnx"
    weights = onnx.load(str(path)).graph.initializer
    weight_bytes = sum(onnx.numpy_helper.to_array(w).nbytes for w in weights)
    assert path.stat().st_size <= 400 * 1024
    assert weight_bytes <= 400 * 1024
    assert weight_bytes == 4 * generator().cnn_stats().parameters


def test_cnn_does_100_to_200_million_macs_per_image() -> None:
    assert 100e6 <= generator().cnn_stats().macs_per_image <= 200e6


def test_cnn_rows_do_not_depend_on_batch_and_sum_to_one() -> None:
    cnn = session(MODEL_REPO / "cnn" / "1" / "model.onnx")
    images = np.random.default_rng(7).random((4, 3, 128, 128), np.float32)
    batched = cnn.run(["PROBS"], {"IMAGE": images})[0]
    single = np.concatenate([cnn.run(["PROBS"], {"IMAGE": images[i:i + 1]})[0] for i in range(4)])
    np.testing.assert_allclose(batched, single, rtol=0, atol=1e-5)
    np.testing.assert_allclose(batched.sum(axis=1), 1.0, rtol=0, atol=1e-5)


def test_stateful_gru_keeps_its_state_out_of_the_declared_tensors() -> None:
    config = parse_config_file(MODEL_REPO / "stateful_gru" / "config.pbtxt")
    assert [t.name for t in config.inputs] == ["FEATURES"]
    assert [t.name for t in config.outputs] == ["LOGITS"]
    graph = onnx.load(str(GRU_PATH)).graph
    assert [i.name for i in graph.input] == ["FEATURES", "HIDDEN_IN"]
    assert [o.name for o in graph.output] == ["HIDDEN_OUT", "LOGITS"]


def test_stateful_gru_second_step_depends_on_the_first() -> None:
    step = generator().onnx_gru_step(session(GRU_PATH))
    first, second = np.random.default_rng(3).standard_normal((2, 1, 3, 16), np.float32)
    zeros = np.zeros((1, 32), np.float32)
    _, hidden = step(first, zeros)
    threaded, _ = step(second, hidden)
    fresh, _ = step(second, zeros)
    assert not np.allclose(threaded, fresh, rtol=0, atol=1e-3)


def test_stateful_gru_batched_steps_match_interleaved_sequences() -> None:
    step = generator().onnx_gru_step(session(GRU_PATH))
    features = np.random.default_rng(4).standard_normal((4, 3, 2, 16), np.float32)  # steps, sequences, frames
    batched_logits, batched_hidden = generator().run_gru_steps(step, features)
    hidden = [np.zeros((1, 32), np.float32) for _ in range(3)]
    for index, step_features in enumerate(features):
        for sequence in range(3):  # one request at a time, sequences taking turns
            logits, hidden[sequence] = step(step_features[sequence:sequence + 1], hidden[sequence])
            np.testing.assert_allclose(logits[0], batched_logits[index, sequence], rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.concatenate(hidden), batched_hidden, rtol=0, atol=1e-5)


def test_stateful_gru_passes_the_generators_check_against_a_numpy_gru() -> None:
    generator().check_stateful_gru(GRU_PATH)


@pytest.mark.parametrize("max_batch_size", [8, 0])
def test_add_sub_adds_and_subtracts(tmp_path: Path, max_batch_size: int) -> None:
    write_add_sub(tmp_path, "renamed", max_batch_size=max_batch_size)
    shape = (3, 16) if max_batch_size else (16,)
    a, b = np.random.default_rng(1).random((2, *shape), np.float32)
    total, difference = session(tmp_path / "renamed" / "1" / "model.onnx").run(None, {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(difference, a - b)
    config = parse_config_file(tmp_path / "renamed" / "config.pbtxt")
    assert (config.name, config.max_batch_size) == ("renamed", max_batch_size)
    assert (config.dynamic_batching is not None) == (max_batch_size > 0)


def sample(datatype: str, batched: bool) -> np.ndarray:
    if datatype == "BYTES":
        values = np.array(["", "ferry", "stra\u00dfe \u2603"], dtype=object)
    elif datatype == "BOOL":
        values = np.array([True, False, True])
    elif numpy_dtype(datatype).kind == "f":
        values = np.array([-0.0, 1.5, np.inf], numpy_dtype(datatype))
    else:
        info = np.iinfo(numpy_dtype(datatype))
        values = np.array([info.min, 1, info.max], numpy_dtype(datatype))
    return np.stack([values, values[::-1]]) if batched else values


@pytest.mark.parametrize("max_batch_size", [8, 0])
@pytest.mark.parametrize("datatype", IDENTITY_DATATYPES)
def test_identity_round_trips_each_datatype_through_onnxruntime(
    tmp_path: Path, datatype: str, max_batch_size: int
) -> None:
    write_identity_model(tmp_path, "identity", [datatype], max_batch_size=max_batch_size)
    value = sample(datatype, batched=max_batch_size > 0)
    (result,) = session(tmp_path / "identity" / "1" / "model.onnx").run([f"OUT_{datatype}"], {f"IN_{datatype}": value})
    assert result.dtype == value.dtype
    np.testing.assert_array_equal(result, value)
    config = parse_config_file(tmp_path / "identity" / "config.pbtxt")
    assert [(t.name, t.datatype, t.dims) for t in config.inputs] == [(f"IN_{datatype}", datatype, (-1,))]


def test_identity_model_serves_many_datatypes_at_once(tmp_path: Path) -> None:
    write_identity_model(tmp_path, "identity", list(IDENTITY_DATATYPES))
    feed = {f"IN_{dt}": sample(dt, batched=True) for dt in IDENTITY_DATATYPES}
    results = session(tmp_path / "identity" / "1" / "model.onnx").run(None, feed)
    for datatype, result in zip(IDENTITY_DATATYPES, results):
        np.testing.assert_array_equal(result, feed[f"IN_{datatype}"])


class _Context:
    def __init__(self) -> None:
        self.config = parse_config_file(MODEL_REPO / "text_stats" / "config.pbtxt")
        self.version_dir = MODEL_REPO / "text_stats" / "1"
        self.parameters: dict[str, str] = {}


@pytest.fixture
def text_stats() -> Iterator[Any]:
    model = import_file(MODEL_REPO / "text_stats" / "1" / "model.py").Model()
    model.load(_Context())
    yield model
    model.unload()


def test_text_stats_upper_cases_and_counts_characters(text_stats: Any) -> None:
    text = np.array([[b"hello"], ["stra\u00dfe".encode()], [b"a\x00"], [b""]], dtype=object)
    outputs = text_stats.infer({"TEXT": text})
    assert outputs["UPPER"].tolist() == [[b"HELLO"], [b"STRASSE"], [b"A\x00"], [b""]]
    assert outputs["LENGTH"].dtype == np.int32
    assert outputs["LENGTH"].tolist() == [[5], [6], [2], [0]]


def test_text_stats_rejects_invalid_utf8_naming_the_input(text_stats: Any) -> None:
    with pytest.raises(ValueError, match="TEXT"):
        text_stats.infer({"TEXT": np.array([[b"ok"], [b"\xff"]], dtype=object)})
