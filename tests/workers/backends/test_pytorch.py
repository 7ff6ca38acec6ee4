from __future__ import annotations

import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

from tests.torch_models import Affine, Classifier, Types, framework_config, write_exported, write_torchscript
from workers.backends.base import ModelContext
from workers.backends.pytorch import PyTorchBackend, choose_device
from workers.batching.buffers import BatchBuffers
from workers.errors import ConfigError, ExecutionError, ModelLoadError
from workers.repository.config import InstanceGroup
from workers.repository.layout import ModelRepository

AFFINE_IO = dict(
    inputs=[("x", "TYPE_FP32", [4]), ("scale", "TYPE_FP32", [1])],
    outputs=[("scaled", "TYPE_FP32", [3]), ("total", "TYPE_FP32", [1])],
)
PYTORCH = 'backend: "pytorch"'


def load(repo: Path, name: str, kind: str = "KIND_CPU", gpus: tuple[int, ...] = ()) -> PyTorchBackend:
    entry = ModelRepository(repo).entry(name)
    backend = PyTorchBackend(ModelContext(
        name=name, version=1, version_dir=entry.path / "1", model_file=entry.model_file(1),
        config=entry.config, instance=InstanceGroup(name=f"{name}_0", kind=kind, gpus=gpus)))
    backend.load()
    return backend


def affine_inputs(rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rows)
    return {"x": rng.standard_normal((rows, 4), dtype=np.float32),
            "scale": rng.random((rows, 1), dtype=np.float32)}


def affine_direct(inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    with torch.inference_mode():
        scaled, total = Affine().eval()(torch.tensor(inputs["x"]), torch.tensor(inputs["scale"]))
    return scaled.numpy(), total.numpy()


def test_torchscript_inputs_bind_by_forward_argument_names(tmp_path: Path):
    # The config lists the inputs in the opposite order to forward(x, scale).
    config = framework_config("affine", PYTORCH, 8, AFFINE_IO["inputs"][::-1], AFFINE_IO["outputs"])
    write_torchscript(tmp_path, "affine", Affine(), config)
    inputs = affine_inputs(5)
    outputs = load(tmp_path, "affine").infer(inputs)
    scaled, total = affine_direct(inputs)
    np.testing.assert_allclose(outputs["scaled"], scaled, rtol=1e-6)
    np.testing.assert_allclose(outputs["total"], total, rtol=1e-6)


def test_triton_positional_names_bind_by_their_index(tmp_path: Path):
    config = framework_config(
        "affine", 'platform: "pytorch_libtorch"', 8,
        [("SCALE__1", "TYPE_FP32", [1]), ("X__0", "TYPE_FP32", [4])],
        [("TOTAL__1", "TYPE_FP32", [1]), ("SCALED__0", "TYPE_FP32", [3])])
    write_torchscript(tmp_path, "affine", Affine(), config)
    inputs = affine_inputs(3)
    outputs = load(tmp_path, "affine").infer({"X__0": inputs["x"], "SCALE__1": inputs["scale"]})
    scaled, total = affine_direct(inputs)
    np.testing.assert_allclose(outputs["SCALED__0"], scaled, rtol=1e-6)
    np.testing.assert_allclose(outputs["TOTAL__1"], total, rtol=1e-6)


def test_a_dict_result_maps_outputs_by_key(tmp_path: Path):
    config = framework_config("classifier", PYTORCH, 4, [("features", "TYPE_FP32", [4])],
                              [("probs", "TYPE_FP32", [5]), ("label", "TYPE_INT64", [1])])
    write_torchscript(tmp_path, "classifier", Classifier(), config)
    features = np.random.default_rng(0).standard_normal((4, 4), dtype=np.float32)
    outputs = load(tmp_path, "classifier").infer({"features": features})
    expected = Classifier().eval()(torch.from_numpy(features))
    np.testing.assert_allclose(outputs["probs"], expected["probs"].detach().numpy(), rtol=1e-6)
    np.testing.assert_array_equal(outputs["label"], expected["label"].numpy())
    assert outputs["label"].dtype == np.int64


def test_fp16_bf16_int64_and_bool_round_trip(tmp_path: Path):
    config = framework_config(
        "types", PYTORCH, 4,
        [("half", "TYPE_FP16", [3]), ("brain", "TYPE_BF16", [3]), ("count", "TYPE_INT64", [3]),
         ("mask", "TYPE_BOOL", [3])],
        [("OUT__0", "TYPE_FP16", [3]), ("OUT__1", "TYPE_BF16", [3]), ("OUT__2", "TYPE_INT64", [3]),
         ("OUT__3", "TYPE_BOOL", [3])])
    write_torchscript(tmp_path, "types", Types(), config)
    inputs = {
        "half": np.array([[0.5, -1.25, 3.0]], np.float16),
        "brain": np.array([[1.5, -2.0, 256.0]], ml_dtypes.bfloat16),
        "count": np.array([[2**40, -1, 0]], np.int64),
        "mask": np.array([[True, False, True]]),
    }
    # As they come off the wire: read-only views of the request's bytes.
    wire = {name: np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape) for name, a in inputs.items()}
    outputs = load(tmp_path, "types").infer(wire)
    np.testing.assert_array_equal(outputs["OUT__0"], inputs["half"] * 2)
    assert outputs["OUT__0"].dtype == np.float16
    assert outputs["OUT__1"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(outputs["OUT__1"].astype(np.float32), [[2.5, -1.0, 256.0]])
    np.testing.assert_array_equal(outputs["OUT__2"], [[2**40 + 1, 0, 1]])
    np.testing.assert_array_equal(outputs["OUT__3"], [[False, True, False]])


def test_read_only_wire_arrays_are_accepted(tmp_path: Path):
    config = framework_config("affine", PYTORCH, 8, **AFFINE_IO)
    write_torchscript(tmp_path, "affine", Affine(), config)
    inputs = {name: np.frombuffer(a.tobytes(), np.float32).reshape(a.shape) for name, a in affine_inputs(2).items()}
    assert not inputs["x"].flags.writeable
    np.testing.assert_allclose(load(tmp_path, "affine").infer(inputs)["scaled"], affine_direct(inputs)[0], rtol=1e-6)


def test_exported_program_with_a_dynamic_batch_matches_the_module(tmp_path: Path):
    config = framework_config("affine", PYTORCH, 16, **AFFINE_IO, extra='default_model_filename: "model.pt2"\n')
    example = tuple(torch.from_numpy(a) for a in affine_inputs(2).values())
    write_exported(tmp_path, "affine", Affine(), example, config)
    backend = load(tmp_path, "affine")
    for rows in (1, 7):
        inputs = affine_inputs(rows)
        outputs = backend.infer(inputs)
        np.testing.assert_allclose(outputs["scaled"], affine_direct(inputs)[0], rtol=1e-6)
        np.testing.assert_allclose(outputs["total"], affine_direct(inputs)[1], rtol=1e-6)


def test_a_version_directory_holding_model_pt2_is_detected_as_pytorch(tmp_path: Path):
    config = framework_config("affine", "", 16, **AFFINE_IO)
    example = tuple(torch.from_numpy(a) for a in affine_inputs(2).values())
    write_exported(tmp_path, "affine", Affine(), example, config)
    entry = ModelRepository(tmp_path).entry("affine")
    assert (entry.config.backend, entry.config.default_model_filename) == ("pytorch", "model.pt2")
    np.testing.assert_allclose(load(tmp_path, "affine").infer(affine_inputs(3))["total"],
                               affine_direct(affine_inputs(3))[1], rtol=1e-6)


def test_an_explicit_pytorch_backend_finds_model_pt2(tmp_path: Path):
    config = framework_config("affine", PYTORCH, 16, **AFFINE_IO)
    example = tuple(torch.from_numpy(a) for a in affine_inputs(2).values())
    write_exported(tmp_path, "affine", Affine(), example, config)
    assert load(tmp_path, "affine").infer(affine_inputs(2))["scaled"].shape == (2, 3)


def test_pytorch_models_need_a_config(tmp_path: Path):
    write_torchscript(tmp_path, "bare", Affine(), "")
    (tmp_path / "bare/config.pbtxt").unlink()
    with pytest.raises(ConfigError, match="pytorch models need a config.pbtxt"):
        ModelRepository(tmp_path).entry("bare")


def test_inputs_that_match_neither_names_nor_positions_fail_the_load(tmp_path: Path):
    config = framework_config("affine", PYTORCH, 8, [("A", "TYPE_FP32", [4]), ("B", "TYPE_FP32", [1])],
                              AFFINE_IO["outputs"])
    write_torchscript(tmp_path, "affine", Affine(), config)
    with pytest.raises(ModelLoadError, match=r"cannot bind inputs \['A', 'B'\] to forward\(x, scale\)"):
        load(tmp_path, "affine")


def test_an_output_of_another_datatype_than_the_config_fails_the_batch(tmp_path: Path):
    config = framework_config("affine", PYTORCH, 8, AFFINE_IO["inputs"],
                              [("scaled", "TYPE_FP16", [3]), ("total", "TYPE_FP32", [1])])
    write_torchscript(tmp_path, "affine", Affine(), config)
    with pytest.raises(ExecutionError, match="output 'scaled' is FP32, but the config says FP16"):
        load(tmp_path, "affine").infer(affine_inputs(1))


def test_a_forward_failure_is_an_execution_error(tmp_path: Path):
    config = framework_config("affine", PYTORCH, 8, [("x", "TYPE_FP32", [-1]), ("scale", "TYPE_FP32", [1])],
                              AFFINE_IO["outputs"])
    write_torchscript(tmp_path, "affine", Affine(), config)
    backend = load(tmp_path, "affine")
    with pytest.raises(ExecutionError, match="forward failed"):
        backend.infer({"x": np.ones((1, 6), np.float32), "scale": np.ones((1, 1), np.float32)})
    assert backend.infer(affine_inputs(1))["scaled"].shape == (1, 3)


# --- placement -------------------------------------------------------------


@pytest.mark.parametrize(("kind", "gpus", "index", "devices", "expected"), [
    ("KIND_CPU", (), 0, 2, "cpu"),
    ("KIND_AUTO", (), 0, 0, "cpu"),
    ("KIND_AUTO", (), 3, 2, "cuda:1"),
    ("KIND_GPU", (), 2, 2, "cuda:0"),
    ("KIND_GPU", (1, 3), 1, 4, "cuda:3"),
    ("KIND_MODEL", (), 0, 1, "model"),
])
def test_placement_follows_the_instance_group(kind, gpus, index, devices, expected):
    assert choose_device(InstanceGroup(name="g", kind=kind, gpus=gpus), index, devices) == expected


def test_a_gpu_the_machine_lacks_fails_the_load():
    with pytest.raises(ModelLoadError, match="names GPU 3, but torch sees 2 CUDA device"):
        choose_device(InstanceGroup(name="g", kind="KIND_GPU", gpus=(3,)), 0, 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA; the no-CUDA error cannot happen here")
def test_kind_gpu_without_cuda_fails_the_load_clearly(tmp_path: Path):
    config = framework_config("affine", PYTORCH, 8, **AFFINE_IO)
    write_torchscript(tmp_path, "affine", Affine(), config)
    with pytest.raises(ModelLoadError, match="is KIND_GPU, but torch sees no CUDA device"):
        load(tmp_path, "affine", kind="KIND_GPU")


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="torch.cuda.is_available() is False: no CUDA device on this machine")
def test_kind_gpu_runs_on_cuda_and_matches_the_cpu(tmp_path: Path):
    config = framework_config("affine", PYTORCH, 8, **AFFINE_IO)
    write_torchscript(tmp_path, "affine", Affine(), config)
    inputs = affine_inputs(8)
    on_gpu = load(tmp_path, "affine", kind="KIND_GPU", gpus=(0,)).infer(inputs)
    on_cpu = load(tmp_path, "affine", kind="KIND_CPU").infer(inputs)
    np.testing.assert_allclose(on_gpu["scaled"], on_cpu["scaled"], rtol=1e-4, atol=1e-6)


def test_a_cpu_instance_asks_for_no_pinned_memory(tmp_path: Path):
    write_torchscript(tmp_path, "affine", Affine(), framework_config("affine", PYTORCH, 8, **AFFINE_IO))
    assert load(tmp_path, "affine").host_allocator() is None


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="torch.cuda.is_available() is False: no CUDA device on this machine")
def test_a_gpu_instance_batches_in_pinned_memory_on_its_own_stream(tmp_path: Path):
    write_torchscript(tmp_path, "affine", Affine(), framework_config("affine", PYTORCH, 8, **AFFINE_IO))
    backend = load(tmp_path, "affine", kind="KIND_GPU", gpus=(0,))
    allocate = backend.host_allocator()
    assert allocate is not None
    buffers = BatchBuffers(8, allocate, copy_single=True)
    inputs = affine_inputs(8)
    merged = buffers.merge([{k: v[:3] for k, v in inputs.items()}, {k: v[3:] for k, v in inputs.items()}])
    assert torch.from_numpy(merged["x"]).is_pinned()
    outputs = backend.infer(merged)
    expected, _ = affine_direct(inputs)
    np.testing.assert_allclose(outputs["scaled"], expected, rtol=1e-4, atol=1e-6)
    bf16 = allocate((2, 3), np.dtype(ml_dtypes.bfloat16))
    assert bf16.dtype == np.dtype(ml_dtypes.bfloat16) and bf16.shape == (2, 3)


# --- files that would run code ---------------------------------------------


class RunsCode:
    """Unpickling this creates the marker file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def rewrite_zip(path: Path, replace: dict[str, bytes], drop: tuple[str, ...] = ()) -> None:
    """Rewrite entries of a zip archive, matched by the end of their names."""
    source = zipfile.ZipFile(io.BytesIO(path.read_bytes()))
    with zipfile.ZipFile(path, "w") as target:
        for name in source.namelist():
            if name.endswith(drop):
                continue
            ending = next((end for end in replace if name.endswith(end)), None)
            target.writestr(name, replace[ending] if ending else source.read(name))


def affine_repo(tmp_path: Path, exported: bool) -> Path:
    config = framework_config("affine", PYTORCH, 8, **AFFINE_IO)
    if exported:
        example = tuple(torch.from_numpy(a) for a in affine_inputs(2).values())
        return write_exported(tmp_path, "affine", Affine(), example, config)
    return write_torchscript(tmp_path, "affine", Affine(), config)


def _edit_json(path: Path, entry: str, edit) -> None:
    archive = zipfile.ZipFile(io.BytesIO(path.read_bytes()))
    name = next(n for n in archive.namelist() if n.endswith(entry))
    document = json.loads(archive.read(name))
    edit(document)
    rewrite_zip(path, {entry: json.dumps(document).encode()})


# Each tampering plants code that would create ``marker`` if it ran.


def torch_save_pickle(path: Path, marker: Path) -> None:
    torch.save({"model": RunsCode(marker)}, str(path))


def python_pickle_in_torchscript(path: Path, marker: Path) -> None:
    evil = pickle.dumps(RunsCode(marker), protocol=2)
    rewrite_zip(path, {"/data.pkl": evil, "/constants.pkl": evil})


def pickled_sample_inputs(path: Path, marker: Path) -> None:
    # torch.export.load itself would run this: it retries with weights_only=False.
    rewrite_zip(path, {"data/sample_inputs/model.pt": pickle.dumps(RunsCode(marker))})


def pickled_weights(path: Path, marker: Path) -> None:
    def pickled(document):
        document["config"]["linear.weight"]["use_pickle"] = True
    _edit_json(path, "model_weights_config.json", pickled)
    rewrite_zip(path, {"data/weights/weight_0": pickle.dumps(RunsCode(marker))})


def opaque_pickled_constant(path: Path, marker: Path) -> None:
    def opaque(document):
        document["config"]["evil"] = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True}
    _edit_json(path, "model_constants_config.json", opaque)
    source = zipfile.ZipFile(io.BytesIO(path.read_bytes()))
    root = source.namelist()[0].split("/")[0]
    with zipfile.ZipFile(path, "a") as target:
        target.writestr(f"{root}/data/constants/opaque_obj_0", pickle.dumps(RunsCode(marker)))


def python_code_as_symbolic_shape(path: Path, marker: Path) -> None:
    planted = []

    def code(document):
        def plant(value):
            if isinstance(value, dict):
                if "expr_str" in value and not planted:
                    value["expr_str"] = f"exec(chr(0)) or __import__('os').mkdir('{marker}')"
                    planted.append(True)
                for item in value.values():
                    plant(item)
            elif isinstance(value, list):
                for item in value:
                    plant(item)
        plant(document)
    _edit_json(path, "models/model.json", code)
    assert planted


def node_calling_a_python_function(path: Path, marker: Path) -> None:
    def retarget(document):
        node = document["graph_module"]["graph"]["nodes"][0]
        node["target"] = "torch.os.system"
    _edit_json(path, "models/model.json", retarget)


@pytest.mark.parametrize(("exported", "tamper", "refusal"), [
    pytest.param(False, torch_save_pickle, "looks like a torch.save pickle, which ferry never loads",
                 id="a-torch-save-pickle-named-model-pt-is-refused-unread"),
    pytest.param(False, python_pickle_in_torchscript, "torch.jit.load refused it",
                 id="a-torchscript-archive-carrying-a-python-pickle"),
    pytest.param(True, pickled_sample_inputs, "sample inputs do not load as plain tensors",
                 id="a-pt2-whose-sample-inputs-are-a-pickle"),
    pytest.param(True, pickled_weights, "'linear.weight' in .* is stored as a pickle",
                 id="a-pt2-with-pickled-weights"),
    pytest.param(True, opaque_pickled_constant, "opaque_obj_0", id="a-pt2-with-an-opaque-pickled-constant"),
    pytest.param(True, python_code_as_symbolic_shape, "symbolic shape .* is not a plain expression",
                 id="a-pt2-whose-symbolic-shape-is-python-code"),
    pytest.param(True, node_calling_a_python_function, "target 'torch.os.system' is not a torch operator",
                 id="a-pt2-node-calling-a-python-function"),
])
def test_a_model_file_that_would_run_code_is_refused(tmp_path: Path, exported: bool, tamper, refusal: str):
    path = affine_repo(tmp_path, exported)
    marker = tmp_path / "code_ran"
    tamper(path, marker)
    with pytest.raises(ModelLoadError, match=refusal):
        load(tmp_path, "affine")
    assert not marker.exists()


def test_the_guard_code_in_a_pt2_is_never_run(tmp_path: Path):
    path = affine_repo(tmp_path, exported=True)
    marker = tmp_path / "code_ran"

    def guards(document):
        document["guards_code"] = [f"__import__('os').mkdir('{marker}')"]
    _edit_json(path, "models/model.json", guards)
    backend = load(tmp_path, "affine")
    assert backend.infer(affine_inputs(2))["scaled"].shape == (2, 3)
    assert not marker.exists()
