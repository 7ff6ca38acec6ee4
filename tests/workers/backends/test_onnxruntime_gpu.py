"""ONNX Runtime on GPUs: the providers an instance asks for, the load error
when this onnxruntime lacks them, and (on a CUDA machine with onnxruntime-gpu)
CUDA and TensorRT results against the CPU's."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.workers.backends.gpus import no_gpu_reason
from workers.backends.base import ModelContext
from workers.backends.onnxruntime import OnnxRuntimeBackend
from workers.backends.onnxruntime_providers import check_active, choose_providers, tensorrt_options
from workers.errors import ModelLoadError
from workers.repository.config import InstanceGroup
from workers.repository.layout import ModelRepository
from workers.repository.optimization_config import Accelerator

MODEL_REPO = Path(__file__).resolve().parents[3] / "model_repo"
ALL = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


def tensorrt_config(precision: str = "FP16", extra: str = "") -> str:
    return ('optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt"\n'
            f'  parameters {{ key: "precision_mode" value: "{precision}" }}\n'
            '  parameters { key: "max_workspace_size_bytes" value: "1073741824" }' + extra + " } ] } }\n")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(MODEL_REPO / "cnn", tmp_path / "cnn")
    return tmp_path


def context_for(repo: Path, kind: str, gpus: tuple[int, ...] = (), optimization: str = "",
                index: int = 0) -> ModelContext:
    config_file = repo / "cnn/config.pbtxt"
    config_file.write_text((MODEL_REPO / "cnn/config.pbtxt").read_text() + optimization)
    entry = ModelRepository(repo).entry("cnn")
    return ModelContext(name="cnn", version=1, version_dir=entry.path / "1", model_file=entry.model_file(1),
                        config=entry.config, instance=InstanceGroup(name="cnn_gpu", kind=kind, gpus=gpus),
                        instance_index=index)


def providers_for(context: ModelContext, available: list[str]) -> list:
    return choose_providers(context.config, context.instance, context.instance_index, available)


def test_tritons_tensorrt_example_becomes_tensorrt_provider_options_on_the_instance_gpu(repo):
    context = context_for(repo, "KIND_GPU", gpus=(3,), optimization=tensorrt_config("FP16"))
    assert providers_for(context, ALL) == [
        ("TensorrtExecutionProvider", {"device_id": "3", "trt_fp16_enable": "True", "trt_int8_enable": "False",
                                       "trt_max_workspace_size": "1073741824"}),
        ("CUDAExecutionProvider", {"device_id": "3"}),
        "CPUExecutionProvider",
    ]


@pytest.mark.parametrize(("parameters", "expected"), [
    ({}, {"trt_fp16_enable": "False", "trt_int8_enable": "False"}),
    ({"precision_mode": "INT8", "int8_calibration_table_name": "calib.flatbuffers",
      "int8_use_native_calibration_table": "false"},
     {"trt_fp16_enable": "False", "trt_int8_enable": "True", "trt_int8_calibration_table_name": "calib.flatbuffers",
      "trt_int8_use_native_calibration_table": "False"}),
    ({"trt_engine_cache_enable": "true", "trt_engine_cache_path": "/cache", "minimum_segment_size": "3",
      "max_partition_iterations": "10"},
     {"trt_fp16_enable": "False", "trt_int8_enable": "False", "trt_engine_cache_enable": "True",
      "trt_engine_cache_path": "/cache", "trt_min_subgraph_size": "3", "trt_max_partition_iterations": "10"}),
])
def test_tensorrt_parameters_map_to_onnxruntime_option_names(parameters, expected):
    options = tensorrt_options(Accelerator(name="tensorrt", parameters=parameters), device=0)
    assert options == {"device_id": "0", **expected}


def test_instances_spread_over_the_groups_gpus(repo):
    devices = [providers_for(context_for(repo, "KIND_GPU", gpus=(0, 1), index=i), ALL)[0][1]["device_id"]
               for i in range(4)]
    assert devices == ["0", "1", "0", "1"]


def test_a_cpu_instance_ignores_gpu_accelerators(repo):
    context = context_for(repo, "KIND_CPU", optimization=tensorrt_config())
    assert providers_for(context, ALL) == ["CPUExecutionProvider"]


def test_asking_for_tensorrt_without_its_provider_names_the_provider_and_the_extra(repo):
    context = context_for(repo, "KIND_GPU", optimization=tensorrt_config())
    with pytest.raises(ModelLoadError) as caught:
        providers_for(context, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    message = str(caught.value)
    assert "model 'cnn' instance group 'cnn_gpu' (KIND_GPU)" in message
    assert "TensorrtExecutionProvider" in message and "pip install 'ferry[gpu]'" in message


def test_an_openvino_cpu_accelerator_needs_its_provider(repo):
    context = context_for(repo, "KIND_CPU", optimization='optimization { execution_accelerators {'
                          ' cpu_execution_accelerator: [ { name: "openvino" } ] } }')
    assert providers_for(context, ["OpenVINOExecutionProvider", "CPUExecutionProvider"])[0] == (
        "OpenVINOExecutionProvider", {})
    with pytest.raises(ModelLoadError, match="OpenVINOExecutionProvider.*onnxruntime-openvino"):
        providers_for(context, ["CPUExecutionProvider"])


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(),
                    reason="this onnxruntime has CUDA; the test pins the error of a CPU-only build")
@pytest.mark.parametrize("optimization", ["", tensorrt_config()])
def test_loading_a_gpu_instance_on_cpu_only_onnxruntime_fails_clearly(repo, optimization):
    backend = OnnxRuntimeBackend(context_for(repo, "KIND_GPU", optimization=optimization))
    with pytest.raises(ModelLoadError, match=r"ExecutionProvider, which the installed onnxruntime lacks \(it has: .*"
                                             r"CPUExecutionProvider.*pip install 'ferry\[gpu\]'"):
        backend.load()


def test_a_provider_onnxruntime_could_not_start_fails_a_gpu_instance_but_not_an_auto_one(repo):
    requested = [("CUDAExecutionProvider", {"device_id": "0"}), "CPUExecutionProvider"]
    gpu = context_for(repo, "KIND_GPU")
    with pytest.raises(ModelLoadError, match="could not start CUDAExecutionProvider"):
        check_active(gpu.config, gpu.instance, requested, ["CPUExecutionProvider"])
    auto = context_for(repo, "KIND_AUTO")
    assert check_active(auto.config, auto.instance, requested, ["CPUExecutionProvider"]) == ["CUDAExecutionProvider"]
    assert check_active(gpu.config, gpu.instance, requested, ["CUDAExecutionProvider", "CPUExecutionProvider"]) == []


def _run(backend: OnnxRuntimeBackend, images: np.ndarray) -> np.ndarray:
    backend.load()
    try:
        return backend.infer({"IMAGE": images})["PROBS"]
    finally:
        backend.unload()


def _cpu_reference(repo: Path, images: np.ndarray) -> np.ndarray:
    return _run(OnnxRuntimeBackend(context_for(repo, "KIND_CPU")), images)


@pytest.mark.skipif(bool(no_gpu_reason(provider="CUDAExecutionProvider")),
                    reason=no_gpu_reason(provider="CUDAExecutionProvider") or "")
def test_cuda_provider_matches_the_cpu(repo):
    images = np.random.default_rng(0).random((8, 3, 128, 128), dtype=np.float32)
    expected = _cpu_reference(repo, images)
    got = _run(OnnxRuntimeBackend(context_for(repo, "KIND_GPU")), images)
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-5)


@pytest.mark.skipif(bool(no_gpu_reason(provider="TensorrtExecutionProvider")),
                    reason=no_gpu_reason(provider="TensorrtExecutionProvider") or "")
@pytest.mark.parametrize(("precision", "atol"), [("FP32", 1e-4), ("FP16", 2e-2)])
def test_tensorrt_provider_matches_the_cpu(repo, precision, atol):
    images = np.random.default_rng(1).random((8, 3, 128, 128), dtype=np.float32)
    expected = _cpu_reference(repo, images)
    got = _run(OnnxRuntimeBackend(context_for(repo, "KIND_GPU", optimization=tensorrt_config(precision))), images)
    np.testing.assert_allclose(got, expected, atol=atol)
