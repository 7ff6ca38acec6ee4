import os
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper
from structlog.testing import capture_logs

from workers.errors import ConfigError, ModelNotFound
from workers.repository.autocomplete import OnnxSignature, TensorSpec, autocomplete, read_signature
from workers.repository.layout import InvalidModelName, ModelRepository

Shape = list[int | str | None]
CONFIG = Path("repo/m/config.pbtxt")


def write_onnx(path: Path, tensors: list[tuple[str, int, Shape]]) -> Path:
    """A model copying each input ``<name>`` to an output ``<name>_out``."""
    inputs = [helper.make_tensor_value_info(name, dtype, shape) for name, dtype, shape in tensors]
    outputs = [helper.make_tensor_value_info(f"{name}_out", dtype, shape) for name, dtype, shape in tensors]
    nodes = [helper.make_node("Identity", [name], [f"{name}_out"]) for name, _, _ in tensors]
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def write_model(root: Path, name: str, config: str | None = None, versions: tuple[int, ...] = (1,),
                shape: Shape | None = None, filename: str = "model.onnx") -> Path:
    for version in versions:
        if filename.endswith(".onnx"):
            write_onnx(root / name / str(version) / filename, [("x", TensorProto.FLOAT, shape or ["batch", 3])])
        else:
            (root / name / str(version)).mkdir(parents=True, exist_ok=True)
            (root / name / str(version) / filename).write_text("class TritonPythonModel: ...\n")
    (root / name).mkdir(parents=True, exist_ok=True)
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)
    return root / name


def signature(shape: tuple[int, ...] = (-1, 3), datatype: str = "FP32") -> OnnxSignature:
    return OnnxSignature(inputs=(TensorSpec("x", datatype, shape),), outputs=(TensorSpec("x_out", datatype, shape),))


# --- reading ONNX signatures -------------------------------------------------

def test_read_signature_maps_types_and_open_dims(tmp_path: Path) -> None:
    path = write_onnx(tmp_path / "m.onnx", [
        ("f32", TensorProto.FLOAT, ["batch", 3]),
        ("f16", TensorProto.FLOAT16, [None, 2]),
        ("text", TensorProto.STRING, [4]),
        ("flag", TensorProto.BOOL, [1]),
        ("ids", TensorProto.INT64, ["batch", "seq"]),
    ])
    found = read_signature(path)
    assert found.inputs == (
        TensorSpec("f32", "FP32", (-1, 3)),
        TensorSpec("f16", "FP16", (-1, 2)),
        TensorSpec("text", "BYTES", (4,)),
        TensorSpec("flag", "BOOL", (1,)),
        TensorSpec("ids", "INT64", (-1, -1)),
    )
    assert [spec.name for spec in found.outputs] == ["f32_out", "f16_out", "text_out", "flag_out", "ids_out"]


def test_read_signature_of_a_broken_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"not a model")
    with pytest.raises(ConfigError) as caught:
        read_signature(path)
    assert str(path) in str(caught.value)


# --- autocomplete ------------------------------------------------------------

def test_autocomplete_variable_batch_enables_batching() -> None:
    completed = autocomplete(CONFIG, {"name": "m"}, signature((-1, 3)))
    assert completed["max_batch_size"] == 4 and completed["dynamic_batching"] == {}
    assert completed["platform"] == "onnxruntime_onnx" and completed["backend"] == "onnxruntime"
    assert completed["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [3]}]
    assert completed["output"] == [{"name": "x_out", "data_type": "TYPE_FP32", "dims": [3]}]


def test_autocomplete_fixed_first_dim_disables_batching() -> None:
    completed = autocomplete(CONFIG, {"name": "m"}, signature((2, 3)))
    assert completed["max_batch_size"] == 0 and "dynamic_batching" not in completed
    assert completed["input"][0]["dims"] == [2, 3]


def test_autocomplete_strings_become_type_string() -> None:
    completed = autocomplete(CONFIG, {}, signature((-1,), "BYTES"))
    assert completed["input"][0] == {"name": "x", "data_type": "TYPE_STRING", "dims": []}


@pytest.mark.parametrize(
    ("given", "dims", "dynamic"),
    [({"max_batch_size": 8}, [3], False), ({"max_batch_size": 0}, [-1, 3], False)],
)
def test_autocomplete_respects_given_max_batch_size(given: dict[str, Any], dims: list[int], dynamic: bool) -> None:
    completed = autocomplete(CONFIG, {"name": "m", **given}, signature((-1, 3)))
    assert completed["max_batch_size"] == given["max_batch_size"]
    assert completed["input"][0]["dims"] == dims
    assert ("dynamic_batching" in completed) is dynamic


def test_autocomplete_keeps_sequence_batching_without_adding_dynamic() -> None:
    completed = autocomplete(CONFIG, {"sequence_batching": {}}, signature((-1, 3)))
    assert completed["max_batch_size"] == 4 and "dynamic_batching" not in completed


def test_autocomplete_fills_missing_fields_of_listed_tensors() -> None:
    completed = autocomplete(CONFIG, {"input": [{"name": "x", "optional": True}]}, signature((-1, 3)))
    assert completed["input"] == [{"name": "x", "optional": True, "data_type": "TYPE_FP32", "dims": [3]}]


def test_autocomplete_full_rank_dims_in_config_mean_no_batching() -> None:
    parsed = {"input": [{"name": "x", "dims": [-1, 3]}]}
    completed = autocomplete(CONFIG, parsed, signature((-1, 3)))
    assert completed["max_batch_size"] == 0 and completed["input"][0]["dims"] == [-1, 3]


def test_autocomplete_config_may_narrow_open_dims() -> None:
    completed = autocomplete(CONFIG, {"input": [{"name": "x", "dims": [5]}]}, signature((-1, -1)))
    assert completed["max_batch_size"] == 4 and completed["input"][0]["dims"] == [5]


def test_autocomplete_leaves_parsed_values_untouched() -> None:
    parsed: dict[str, Any] = {"input": [{"name": "x"}]}
    autocomplete(CONFIG, parsed, signature())
    assert parsed == {"input": [{"name": "x"}]}


@pytest.mark.parametrize(
    ("parsed", "shape", "field", "fragment"),
    [
        ({"input": [{"name": "nope"}]}, (-1, 3), "input[0].name", "no input 'nope'"),
        ({"output": [{"name": "x_out"}, {"name": "zz"}]}, (-1, 3), "output[1].name", "no output 'zz'"),
        ({"input": [{"name": "x", "data_type": "TYPE_INT32"}]}, (-1, 3), "input[0].data_type", "TYPE_FP32"),
        ({"max_batch_size": 4, "input": [{"name": "x", "dims": [4]}]}, (-1, 3), "input[0].dims", "[3]"),
        ({"max_batch_size": 0, "output": [{"name": "x_out", "dims": [3]}]}, (-1, 3), "output[0].dims", "[-1, 3]"),
        ({"max_batch_size": 4, "input": [{"name": "x", "dims": [6], "reshape": {"shape": [2, 3]}}]}, (-1, 3),
         "input[0].reshape.shape", "[3]"),
        ({"max_batch_size": 2}, (1, 3), "max_batch_size", "variable first dimension"),
    ],
)
def test_autocomplete_rejects_contradictions(parsed: dict[str, Any], shape: tuple[int, ...], field: str,
                                             fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        autocomplete(CONFIG, parsed, signature(shape))
    assert caught.value.field == field and str(CONFIG) in str(caught.value) and fragment in str(caught.value)


def test_autocomplete_leaves_malformed_values_for_validation() -> None:
    completed = autocomplete(CONFIG, {"max_batch_size": "8", "input": [{"name": ["x"]}]}, signature())
    assert completed["max_batch_size"] == "8"


# --- the repository ----------------------------------------------------------

def test_onnx_model_without_config_is_autocompleted(tmp_path: Path) -> None:
    write_model(tmp_path, "ident")
    entry = ModelRepository(tmp_path).entry("ident")
    assert entry.name == "ident" and entry.config.name == "ident"
    assert entry.config.backend == "onnxruntime" and entry.config.platform == "onnxruntime_onnx"
    assert entry.config.max_batch_size == 4 and entry.config.dynamic_batching is not None
    assert entry.config.inputs[0].dims == (3,) and entry.config.outputs[0].name == "x_out"
    assert entry.versions == (1,)
    assert entry.model_file(1) == tmp_path.resolve() / "ident" / "1" / "model.onnx"


def test_scan_keeps_good_models_and_rejects_bad_ones(tmp_path: Path) -> None:
    write_model(tmp_path, "good")
    write_model(tmp_path, "bad_type", 'input { name: "x" data_type: TYPE_INT8 }')
    write_model(tmp_path, "bad_syntax", "max_batch_size: ")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "README.md").write_text("not a model")
    with capture_logs() as logs:
        index = ModelRepository(tmp_path).scan()
    assert list(index.entries) == ["good"]
    assert set(index.errors) == {"bad_type", "bad_syntax"}
    assert index.errors["bad_type"].field == "input[0].data_type"
    assert "bad_syntax/config.pbtxt" in str(index.errors["bad_syntax"])
    assert index.names == ("bad_syntax", "bad_type", "good")
    rejected = {log["model"] for log in logs if log["event"] == "repository.model_rejected"}
    assert rejected == {"bad_type", "bad_syntax"}


def test_config_is_checked_against_the_model(tmp_path: Path) -> None:
    write_model(tmp_path, "m", 'max_batch_size: 8 input { name: "x" data_type: TYPE_FP32 dims: [ 3 ] }')
    config = ModelRepository(tmp_path).entry("m").config
    assert config.max_batch_size == 8 and config.dynamic_batching is None
    assert [o.name for o in config.outputs] == ["x_out"]


def test_config_name_must_match_directory(tmp_path: Path) -> None:
    write_model(tmp_path, "m", 'name: "other"')
    with pytest.raises(ConfigError) as caught:
        ModelRepository(tmp_path).entry("m")
    assert caught.value.field == "name" and "m/config.pbtxt" in str(caught.value)


def test_backend_is_detected_from_the_model_file(tmp_path: Path) -> None:
    write_model(tmp_path, "m", 'max_batch_size: 2')
    assert ModelRepository(tmp_path).entry("m").config.backend == "onnxruntime"


PYTHON_CONFIG = """
backend: "python"
input { name: "IN" data_type: TYPE_STRING dims: [ -1 ] }
output { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] }
"""


def test_python_model_with_config(tmp_path: Path) -> None:
    write_model(tmp_path, "py", PYTHON_CONFIG, filename="model.py")
    entry = ModelRepository(tmp_path).entry("py")
    assert entry.config.backend == "python" and entry.config.inputs[0].datatype == "BYTES"
    assert entry.model_file(1).name == "model.py"


def test_python_backend_is_detected_by_model_py(tmp_path: Path) -> None:
    config = PYTHON_CONFIG.replace('backend: "python"', "")
    write_model(tmp_path, "py", config, filename="model.py")
    assert ModelRepository(tmp_path).entry("py").config.backend == "python"


def test_python_model_needs_a_config(tmp_path: Path) -> None:
    write_model(tmp_path, "py", None, filename="model.py")
    with pytest.raises(ConfigError, match="python models need a config.pbtxt"):
        ModelRepository(tmp_path).entry("py")


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        ("", (3,)),
        ("version_policy { latest { num_versions: 2 } }", (2, 3)),
        ("version_policy { all {} }", (1, 2, 3)),
        ("version_policy { specific { versions: [1, 3] } }", (1, 3)),
    ],
)
def test_versions_follow_the_policy(tmp_path: Path, policy: str, served: tuple[int, ...]) -> None:
    root = write_model(tmp_path, "m", policy, versions=(1, 2, 3))
    (root / "0").mkdir()
    (root / "07").mkdir()
    (root / "latest").mkdir()
    (root / "4").write_text("a file, not a version directory")
    assert ModelRepository(tmp_path).entry("m").versions == served


def test_specific_version_that_does_not_exist(tmp_path: Path) -> None:
    write_model(tmp_path, "m", "version_policy { specific { versions: [1, 5] } }")
    with pytest.raises(ConfigError) as caught:
        ModelRepository(tmp_path).entry("m")
    assert caught.value.field == "version_policy.specific.versions" and "[5]" in str(caught.value)


def test_model_without_versions_is_rejected(tmp_path: Path) -> None:
    write_model(tmp_path, "m", PYTHON_CONFIG, versions=())
    with pytest.raises(ConfigError) as caught:
        ModelRepository(tmp_path).entry("m")
    assert caught.value.field == "version_policy"


def test_model_file_uses_default_model_filename(tmp_path: Path) -> None:
    write_model(tmp_path, "m", 'default_model_filename: "net.onnx"', versions=(1, 2), filename="net.onnx")
    entry = ModelRepository(tmp_path).entry("m")
    assert entry.model_file(2) == tmp_path.resolve() / "m" / "2" / "net.onnx"
    assert entry.config.to_json()["default_model_filename"] == "net.onnx"
    with pytest.raises(ModelNotFound, match="no version 1"):
        entry.model_file(1)


def test_default_model_filename_must_not_be_a_path(tmp_path: Path) -> None:
    write_model(tmp_path, "m", 'default_model_filename: "../../etc/passwd"')
    with pytest.raises(ConfigError) as caught:
        ModelRepository(tmp_path).entry("m")
    assert caught.value.field == "default_model_filename"


def test_missing_onnx_file_for_autocomplete(tmp_path: Path) -> None:
    write_model(tmp_path, "m", 'platform: "onnxruntime_onnx"', filename="model.py")
    with pytest.raises(ConfigError, match="model.onnx"):
        ModelRepository(tmp_path).entry("m")


def test_unknown_platform_is_rejected(tmp_path: Path) -> None:
    write_model(tmp_path, "m", 'platform: "caffe2_netdef"')
    with pytest.raises(ConfigError) as caught:
        ModelRepository(tmp_path).entry("m")
    assert caught.value.field == "platform"


def test_unknown_model_is_not_found(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    repository = ModelRepository(tmp_path)
    for name in ("absent", "afile"):
        with pytest.raises(ModelNotFound):
            repository.entry(name)


@pytest.mark.parametrize("name", ["", ".", "..", "../m", "m/..", "a/b", "a\\b", "a\0b", ".hidden", "/etc"])
def test_unsafe_names_are_refused(tmp_path: Path, name: str) -> None:
    write_model(tmp_path / "inner", "m")
    (tmp_path / "inner" / ".hidden").mkdir()
    with pytest.raises(InvalidModelName):
        ModelRepository(tmp_path / "inner").entry(name)


def test_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    outside = write_model(tmp_path / "outside", "m")
    root = tmp_path / "repo"
    root.mkdir()
    os.symlink(outside, root / "escape")
    repository = ModelRepository(root)
    with pytest.raises(InvalidModelName):
        repository.entry("escape")
    index = repository.scan()
    assert not index.entries and index.errors["escape"].field == "name"


def test_missing_root_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        ModelRepository(tmp_path / "absent").scan()
