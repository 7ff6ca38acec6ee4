"""TensorRT backend: the pure decisions (datatypes, profiles, config against
engine) everywhere; engines built from model_repo/cnn and run against ONNX
Runtime on the CPU where a GPU and tensorrt are present."""

from __future__ import annotations

import importlib.util
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.workers.backends.gpus import cuda_devices, no_gpu_reason
from workers.backends import backend_factory
from workers.backends.tensorrt_io import (
    TRITON_TO_TENSORRT,
    EngineTensor,
    Profile,
    ShapeRange,
    check_engine,
    choose_profile,
    triton_datatype,
)
from workers.datatypes import numpy_dtype
from workers.errors import InvalidInput, ModelLoadError
from workers.repository.config import ModelConfig

MODEL_REPO = Path(__file__).resolve().parents[3] / "model_repo"
IMAGE = (3, 128, 128)


def profile(index: int, low: int, opt: int, high: int, name: str = "IMAGE", rest: tuple[int, ...] = IMAGE) -> Profile:
    return Profile(index, {name: ShapeRange((low, *rest), (opt, *rest), (high, *rest))})


def cnn_config(**changes: object) -> ModelConfig:
    body: dict[str, object] = {
        "name": "cnn_trt", "platform": "tensorrt_plan", "max_batch_size": 64,
        "input": [{"name": "IMAGE", "data_type": "TYPE_FP32", "dims": list(IMAGE)}],
        "output": [{"name": "PROBS", "data_type": "TYPE_FP32", "dims": [10]}],
    }
    body.update(changes)
    return ModelConfig.model_validate(body)


ENGINE = [EngineTensor("IMAGE", True, "FP32", (-1, *IMAGE)), EngineTensor("PROBS", False, "FP32", (-1, 10))]


@pytest.mark.parametrize(("tensorrt", "triton"), [
    ("FLOAT", "FP32"), ("HALF", "FP16"), ("BF16", "BF16"), ("INT8", "INT8"), ("INT32", "INT32"),
    ("INT64", "INT64"), ("BOOL", "BOOL"), ("UINT8", "UINT8"),
])
def test_tensorrt_types_map_to_triton_datatypes_with_numpy_forms(tensorrt, triton):
    assert triton_datatype("x", tensorrt) == triton
    assert numpy_dtype(triton).itemsize >= 1
    assert TRITON_TO_TENSORRT[triton] == tensorrt


@pytest.mark.parametrize("tensorrt", ["FP8", "INT4", "FP4"])
def test_engine_only_types_fail_the_load_naming_the_tensor(tensorrt):
    with pytest.raises(ModelLoadError, match=f"engine tensor 'logits' has TensorRT type {tensorrt}"):
        triton_datatype("logits", tensorrt)


@pytest.mark.parametrize(("profiles", "batch", "chosen"), [
    ([profile(0, 1, 8, 64)], 1, 0),
    ([profile(0, 1, 8, 64)], 64, 0),
    ([profile(0, 1, 4, 8), profile(1, 9, 32, 64)], 8, 0),
    ([profile(0, 1, 4, 8), profile(1, 9, 32, 64)], 9, 1),
    ([profile(0, 1, 64, 64), profile(1, 1, 8, 16)], 8, 1),  # both take it; 1 is tuned for it
    ([profile(0, 1, 8, 64), profile(1, 1, 8, 64)], 8, 0),  # a tie goes to the lower index
])
def test_a_batch_gets_the_profile_that_takes_it_and_is_tuned_closest(profiles, batch, chosen):
    assert choose_profile(profiles, {"IMAGE": (batch, *IMAGE)}) == chosen


def test_a_batch_no_profile_takes_is_invalid_input_naming_tensor_and_ranges():
    with pytest.raises(InvalidInput) as caught:
        choose_profile([profile(0, 1, 4, 8), profile(1, 9, 16, 32)], {"IMAGE": (33, *IMAGE)})
    assert str(caught.value) == ("input 'IMAGE': shape [33, 3, 128, 128] fits no optimization profile of the "
                                 "TensorRT engine (profile 0 takes [1..8, 3, 128, 128]; "
                                 "profile 1 takes [9..32, 3, 128, 128])")


def test_a_wrong_inner_dimension_fits_no_profile():
    with pytest.raises(InvalidInput, match=r"input 'IMAGE': shape \[2, 3, 64, 64\]"):
        choose_profile([profile(0, 1, 8, 64)], {"IMAGE": (2, 3, 64, 64)})


def test_inputs_that_each_fit_but_not_in_one_profile_are_refused_together():
    profiles = [Profile(0, {"A": ShapeRange((1,), (1,), (4,)), "B": ShapeRange((1,), (1,), (4,))}),
                Profile(1, {"A": ShapeRange((5,), (6,), (8,)), "B": ShapeRange((5,), (6,), (8,))})]
    with pytest.raises(InvalidInput, match="fit no single optimization profile"):
        choose_profile(profiles, {"A": (2,), "B": (6,)})


def test_a_config_that_agrees_with_the_engine_passes_fp32_io_of_an_fp16_engine_included():
    check_engine(cnn_config(), ENGINE, [profile(0, 1, 8, 64)])


@pytest.mark.parametrize(("config", "engine", "message"), [
    (cnn_config(output=[{"name": "LOGITS", "data_type": "TYPE_FP32", "dims": [10]}]), ENGINE,
     r"output 'LOGITS': the TensorRT engine has no output of that name \(its outputs: \['PROBS'\]\)"),
    (cnn_config(input=[{"name": "IMAGE", "data_type": "TYPE_FP16", "dims": list(IMAGE)}]), ENGINE,
     "input 'IMAGE': the config says FP16, the TensorRT engine has FP32"),
    (cnn_config(input=[{"name": "IMAGE", "data_type": "TYPE_FP32", "dims": [3, 64, 64]}]), ENGINE,
     r"input 'IMAGE': the config's shape \[-1 \(batch\), 3, 64, 64\] does not match the TensorRT engine's "
     r"\[-1, 3, 128, 128\]"),
    (cnn_config(), [*ENGINE, EngineTensor("MASK", True, "BOOL", (-1, 4))],
     r"the TensorRT engine takes input\(s\) \['MASK'\], which the model config does not list"),
    (cnn_config(max_batch_size=128), ENGINE, "max_batch_size 128 exceeds the largest batch .* \\(64\\)"),
])
def test_a_config_that_disagrees_with_the_engine_fails_naming_the_tensor(config, engine, message):
    with pytest.raises(ModelLoadError, match=message):
        check_engine(config, engine, [profile(0, 1, 8, 64)])


def test_profiles_must_cover_every_batch_size_the_batcher_may_form():
    check_engine(cnn_config(), ENGINE, [profile(0, 9, 32, 64), profile(1, 1, 4, 8)])
    with pytest.raises(ModelLoadError, match="batch size 9 \\(up to max_batch_size 64\\) falls in no optimization"):
        check_engine(cnn_config(), ENGINE, [profile(0, 1, 4, 8), profile(1, 10, 32, 64)])
    with pytest.raises(ModelLoadError, match="batch size 1 "):
        check_engine(cnn_config(), ENGINE, [profile(0, 2, 4, 64)])


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="tensorrt is installed here")
def test_without_tensorrt_the_backend_fails_to_load_naming_the_extra():
    with pytest.raises(ModelLoadError) as caught:
        backend_factory("tensorrt", "cnn_trt")
    assert str(caught.value) == ("model 'cnn_trt': backend 'tensorrt' needs tensorrt, which is not installed; "
                                 "install it with: pip install 'ferry[gpu]'")


# --- on a GPU ------------------------------------------------------------------

CUDA_REASON = no_gpu_reason()
TENSORRT_REASON = no_gpu_reason(tensorrt=True)


@pytest.mark.skipif(CUDA_REASON is not None, reason=CUDA_REASON or "")
def test_device_buffers_round_trip_and_grow():
    from workers.backends.cuda_memory import DeviceBuffer, Stream

    stream, buffer = Stream(0), DeviceBuffer("x")
    try:
        for size in (16, 4096, 8):
            sent = np.arange(size, dtype=np.float32)
            buffer.upload(sent, stream)
            back = np.empty_like(sent)
            buffer.download(back, stream)
            stream.synchronize()
            np.testing.assert_array_equal(back, sent)
        assert buffer.capacity == 4096 * 4
    finally:
        buffer.close()
        stream.close()


def test_the_cuda_runtime_explains_a_machine_without_gpus():
    count, why = cuda_devices()
    assert count > 0 or why


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from workers.offline.tensorrt_build import BatchRange, BuildSettings, build_engine

    folder = tmp_path_factory.mktemp("engines")
    onnx_file = MODEL_REPO / "cnn/1/model.onnx"
    built = {}
    for name, settings in {
        "FP32": BuildSettings("FP32"),
        "FP16": BuildSettings("FP16"),
        "TWO_PROFILES": BuildSettings("FP32", (BatchRange(1, 4, 8), BatchRange(9, 32, 64))),
    }.items():
        built[name] = folder / f"{name}.plan"
        built[name].write_bytes(build_engine(onnx_file, settings))
    return built


def _trt_backend(tmp_path: Path, plan: Path, index: int = 0):
    from workers.backends.base import ModelContext
    from workers.backends.tensorrt import TensorRTBackend

    version = tmp_path / "cnn_trt/1"
    version.mkdir(parents=True, exist_ok=True)
    shutil.copy(plan, version / "model.plan")
    config = cnn_config()
    return TensorRTBackend(ModelContext("cnn_trt", 1, version, version / "model.plan", config,
                                        config.instance_groups[0], index))


def _cpu_probs(images: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(MODEL_REPO / "cnn/1/model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(["PROBS"], {"IMAGE": images})[0]


@pytest.mark.skipif(TENSORRT_REASON is not None, reason=TENSORRT_REASON or "")
@pytest.mark.parametrize(("precision", "atol"), [("FP32", 1e-4), ("FP16", 2e-2)])
def test_engines_match_onnxruntime_on_the_cpu(tmp_path, engines, precision, atol):
    backend = _trt_backend(tmp_path, engines[precision])
    backend.load()
    try:
        for batch in (1, 8, 64):
            images = np.random.default_rng(batch).random((batch, *IMAGE), dtype=np.float32)
            probs = backend.infer({"IMAGE": images})["PROBS"]
            assert probs.dtype == np.float32 and probs.shape == (batch, 10)
            np.testing.assert_allclose(probs, _cpu_probs(images), atol=atol)
    finally:
        backend.unload()


@pytest.mark.skipif(TENSORRT_REASON is not None, reason=TENSORRT_REASON or "")
def test_batches_switch_between_profiles_and_a_batch_beyond_them_is_refused(tmp_path, engines):
    backend = _trt_backend(tmp_path, engines["TWO_PROFILES"])
    backend.load()
    try:
        for batch in (3, 40, 8, 9):
            images = np.random.default_rng(batch).random((batch, *IMAGE), dtype=np.float32)
            np.testing.assert_allclose(backend.infer({"IMAGE": images})["PROBS"], _cpu_probs(images), atol=1e-4)
        with pytest.raises(InvalidInput, match="input 'IMAGE': shape \\[65, 3, 128, 128\\] fits no"):
            backend.infer({"IMAGE": np.zeros((65, *IMAGE), np.float32)})
        with pytest.raises(InvalidInput, match="input 'IMAGE': the TensorRT engine takes FP32"):
            backend.infer({"IMAGE": np.zeros((2, *IMAGE), np.float64)})
    finally:
        backend.unload()


@pytest.mark.skipif(TENSORRT_REASON is not None, reason=TENSORRT_REASON or "")
def test_two_instances_run_at_once_each_on_its_own_context_and_stream(tmp_path, engines):
    backends = [_trt_backend(tmp_path, engines["FP32"], index) for index in range(2)]
    images = [np.random.default_rng(i).random((16, *IMAGE), dtype=np.float32) for i in range(2)]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda b: b.load(), backends))
        try:
            results = list(pool.map(lambda pair: [pair[0].infer({"IMAGE": pair[1]})["PROBS"] for _ in range(20)],
                                    zip(backends, images)))
        finally:
            list(pool.map(lambda b: b.unload(), backends))
    for runs, batch in zip(results, images):
        expected = _cpu_probs(batch)
        for probs in runs:
            np.testing.assert_allclose(probs, expected, atol=1e-4)


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is None or CUDA_REASON is None,
                    reason="needs tensorrt installed on a machine without a GPU")
def test_with_tensorrt_but_no_gpu_the_load_says_so(tmp_path):
    plan = tmp_path / "empty.plan"
    plan.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="no GPU 0 for TensorRT"):
        _trt_backend(tmp_path, plan).load()
