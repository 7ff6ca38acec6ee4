from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from tests.torch_models import (SmallCnn, framework_config, version_dir, write_onnx_for_openvino,
                                write_onnx_from_torch, write_openvino_ir)
from workers.backends.base import ModelContext
from workers.backends.openvino import OpenVinoBackend
from workers.errors import ModelLoadError
from workers.repository.config import InstanceGroup
from workers.repository.layout import ModelRepository

CNN_IO = dict(inputs=[("IMAGE", "TYPE_FP32", [3, 16, 16])], outputs=[("LOGITS", "TYPE_FP32", [10])])
OPENVINO = 'backend: "openvino"'


@pytest.fixture(scope="module")
def cnn_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("onnx") / "cnn.onnx"
    return write_onnx_from_torch(path, SmallCnn(), (torch.randn(2, 3, 16, 16),), ["IMAGE"], ["LOGITS"])


def load(repo: Path, name: str, kind: str = "KIND_CPU") -> OpenVinoBackend:
    entry = ModelRepository(repo).entry(name)
    backend = OpenVinoBackend(ModelContext(
        name=name, version=1, version_dir=entry.path / "1", model_file=entry.model_file(1),
        config=entry.config, instance=InstanceGroup(name=f"{name}_0", kind=kind)))
    backend.load()
    return backend


def onnxruntime_logits(onnx_path: Path, images: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return session.run(["LOGITS"], {"IMAGE": images})[0]


def images(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).standard_normal((rows, 3, 16, 16), dtype=np.float32)


def test_ir_converted_from_onnx_matches_onnxruntime(tmp_path: Path, cnn_onnx: Path):
    write_openvino_ir(tmp_path, "cnn", cnn_onnx, framework_config("cnn", OPENVINO, 8, **CNN_IO))
    backend = load(tmp_path, "cnn")
    for rows in (1, 5):
        logits = backend.infer({"IMAGE": images(rows)})["LOGITS"]
        np.testing.assert_allclose(logits, onnxruntime_logits(cnn_onnx, images(rows)), rtol=1e-4, atol=1e-5)


def test_onnx_read_directly_by_openvino(tmp_path: Path, cnn_onnx: Path):
    config = framework_config("cnn", OPENVINO, 8, **CNN_IO, extra='default_model_filename: "model.onnx"\n')
    write_onnx_for_openvino(tmp_path, "cnn", cnn_onnx, config)
    logits = load(tmp_path, "cnn").infer({"IMAGE": images(3)})["LOGITS"]
    np.testing.assert_allclose(logits, onnxruntime_logits(cnn_onnx, images(3)), rtol=1e-4, atol=1e-5)


def test_a_model_xml_without_a_backend_is_detected_as_openvino(tmp_path: Path, cnn_onnx: Path):
    write_openvino_ir(tmp_path, "cnn", cnn_onnx, framework_config("cnn", "", 8, **CNN_IO))
    assert ModelRepository(tmp_path).entry("cnn").config.backend == "openvino"


def test_a_fixed_batch_file_gets_a_dynamic_batch(tmp_path: Path):
    fixed = write_onnx_from_torch(tmp_path / "fixed.onnx", SmallCnn(), (torch.randn(1, 3, 16, 16),),
                                  ["IMAGE"], ["LOGITS"], dynamic_batch=False)
    write_openvino_ir(tmp_path, "cnn", fixed, framework_config("cnn", OPENVINO, 8, **CNN_IO))
    logits = load(tmp_path, "cnn").infer({"IMAGE": images(4)})["LOGITS"]
    expected = np.concatenate([onnxruntime_logits(fixed, images(4)[i:i + 1]) for i in range(4)])
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)


def test_a_config_input_the_model_lacks_fails_the_load(tmp_path: Path, cnn_onnx: Path):
    config = framework_config("cnn", OPENVINO, 8, [("PIXELS", "TYPE_FP32", [3, 16, 16])], CNN_IO["outputs"])
    write_openvino_ir(tmp_path, "cnn", cnn_onnx, config)
    with pytest.raises(ModelLoadError, match="the model has no input 'PIXELS' \\(its inputs: IMAGE\\)"):
        load(tmp_path, "cnn")


def test_an_ir_without_its_weights_fails_the_load(tmp_path: Path, cnn_onnx: Path):
    path = write_openvino_ir(tmp_path, "cnn", cnn_onnx, framework_config("cnn", OPENVINO, 8, **CNN_IO))
    path.with_suffix(".bin").unlink()
    with pytest.raises(ModelLoadError, match="openvino could not read it"):
        load(tmp_path, "cnn")


def test_kind_gpu_is_refused(tmp_path: Path, cnn_onnx: Path):
    write_openvino_ir(tmp_path, "cnn", cnn_onnx, framework_config("cnn", OPENVINO, 8, **CNN_IO))
    with pytest.raises(ModelLoadError, match="runs on the CPU only"):
        load(tmp_path, "cnn", kind="KIND_GPU")


def test_a_file_that_is_not_a_model_fails_the_load(tmp_path: Path):
    version = version_dir(tmp_path, "junk", framework_config("junk", OPENVINO, 8, **CNN_IO))
    (version / "model.xml").write_text("<not a model/>")
    with pytest.raises(ModelLoadError, match="model.xml: openvino could not read it"):
        load(tmp_path, "junk")
