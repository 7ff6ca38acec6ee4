from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.workers.backends.gpus import no_gpu_reason
from workers.backends.base import ModelContext
from workers.backends.onnxruntime import OnnxRuntimeBackend
from workers.backends.onnxruntime_providers import choose_providers
from workers.errors import ModelLoadError
from workers.repository.config import InstanceGroup
from workers.repository.layout import ModelRepository

MODEL_REPO = Path(__file__).resolve().parents[3] / "model_repo"


def context_for(repo: Path, name: str, kind: str = "KIND_CPU", gpus: tuple[int, ...] = ()) -> ModelContext:
    entry = ModelRepository(repo).entry(name)
    return ModelContext(name=name, version=1, version_dir=entry.path / "1", model_file=entry.model_file(1),
                        config=entry.config, instance=InstanceGroup(kind=kind, gpus=gpus))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(MODEL_REPO / "cnn", tmp_path / "cnn")
    return tmp_path


def _providers(context: ModelContext, available: list[str]) -> list:
    return choose_providers(context.config, context.instance, context.instance_index, available)


def test_cpu_instances_use_the_cpu_provider_only(repo):
    context = context_for(repo, "cnn", "KIND_CPU")
    assert _providers(context, ["CUDAExecutionProvider", "CPUExecutionProvider"]) == ["CPUExecutionProvider"]


def test_gpu_instances_prefer_cuda_on_the_named_device(repo):
    context = context_for(repo, "cnn", "KIND_GPU", gpus=(1,))
    providers = _providers(context, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert providers == [("CUDAExecutionProvider", {"device_id": "1"}), "CPUExecutionProvider"]


def test_tensorrt_is_tried_first_when_the_config_asks_for_it(repo):
    config = repo / "cnn/config.pbtxt"
    config.write_text(config.read_text() + '\noptimization { execution_accelerators {\n'
                      '  gpu_execution_accelerator: [ { name: "tensorrt"\n'
                      '    parameters { key: "precision_mode" value: "FP16" } } ] } }\n')
    context = context_for(repo, "cnn", "KIND_GPU")
    providers = _providers(context, ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    assert providers[0][0] == "TensorrtExecutionProvider" and providers[0][1]["trt_fp16_enable"] == "True"
    assert providers[1][0] == "CUDAExecutionProvider"


def test_a_gpu_instance_without_cuda_fails_the_load_instead_of_using_the_cpu(repo):
    context = context_for(repo, "cnn", "KIND_GPU")
    with pytest.raises(ModelLoadError, match="CUDAExecutionProvider.*pip install 'ferry\\[gpu\\]'"):
        _providers(context, ["CPUExecutionProvider"])


def test_an_auto_instance_without_cuda_runs_on_the_cpu(repo):
    context = context_for(repo, "cnn", "KIND_AUTO")
    assert _providers(context, ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]


@pytest.mark.skipif(bool(no_gpu_reason(provider="CUDAExecutionProvider")),
                    reason=no_gpu_reason(provider="CUDAExecutionProvider") or "")
def test_cuda_results_match_cpu(repo):
    images = np.random.default_rng(0).random((8, 3, 128, 128), dtype=np.float32)
    outputs = {}
    for kind in ("KIND_CPU", "KIND_GPU"):
        backend = OnnxRuntimeBackend(context_for(repo, "cnn", kind))
        backend.load()
        outputs[kind] = backend.infer({"IMAGE": images})["PROBS"]
        backend.unload()
    np.testing.assert_allclose(outputs["KIND_GPU"], outputs["KIND_CPU"], rtol=1e-3, atol=1e-5)
