import json
import random
from pathlib import Path

import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs

from workers.errors import ConfigError
from workers.repository.config import DynamicBatching, InstanceGroup, ModelConfig, VersionPolicy
from workers.repository.config_file import load_config, load_version_policy, parse_config_file
from workers.repository.layout import ModelRepository
from workers.repository.pbtxt import parse

PATH = Path("repo/densenet_onnx/config.pbtxt")

# The shape of the examples in Triton's docs (densenet_onnx and friends).
DENSENET = """
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { latest: { num_versions: 2 } }
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape { shape: [ 3, 224, 224 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    label_filename: "densenet_labels.txt"
  }
]
instance_group [
  { count: 2, kind: KIND_GPU, gpus: [ 0, 1 ] },
  { name: "cpu_pool" count: 1, kind: KIND_CPU }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000 }
}
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }
model_warmup [
  {
    name: "warmup"
    batch_size: 1
    inputs { key: "data_0" value: { data_type: TYPE_FP32 dims: [ 3, 224, 224 ] zero_data: true } }
  }
]
optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" } ] } }
"""

MINIMAL = 'name: "m" input { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } output { name: "y" data_type: TYPE_STRING dims: [ -1 ] }'


def _load(text: str) -> ModelConfig:
    return load_config(PATH, parse(text, str(PATH)))


def test_real_triton_config_loads_with_warnings_for_unsupported_fields() -> None:
    with capture_logs() as logs:
        config = _load(DENSENET)
    assert config.name == "densenet_onnx"
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 8 and config.batching_enabled
    assert config.inputs[0].datatype == "FP32" and config.inputs[0].dims == (3, 224, 224)
    assert config.inputs[0].reshape is not None and config.inputs[0].reshape.shape == (3, 224, 224)
    assert config.version_policy.kind == "latest" and config.version_policy.select([1, 2, 3]) == (2, 3)
    assert config.parameters == {"intra_op_thread_count": "2", "cudnn_conv_algo_search": "1"}
    warned = {(log["event"], log["file"], log["field"]) for log in logs if log["log_level"] == "warning"}
    assert warned == {("config.unsupported_field", str(PATH), "input[0].format")}
    assert config.outputs[0].label_filename == "densenet_labels.txt"
    assert config.model_warmup[0].name == "warmup" and "model_warmup" not in config.extras


def test_instance_groups_and_dynamic_batching() -> None:
    config = _load(DENSENET)
    assert config.instance_groups == (
        InstanceGroup(name="densenet_onnx_0", count=2, kind="KIND_GPU", gpus=(0, 1)),
        InstanceGroup(name="cpu_pool", count=1, kind="KIND_CPU"),
    )
    assert config.instance_count == 3
    batching = config.dynamic_batching
    assert batching is not None
    assert batching.preferred_batch_size == (4, 8)
    assert batching.max_queue_delay_microseconds == 100
    assert batching.default_queue_policy.timeout_action == "DELAY"
    assert batching.default_queue_policy.default_timeout_microseconds == 5000


def test_defaults_for_a_minimal_config() -> None:
    config = _load(MINIMAL)
    assert config.max_batch_size == 0 and not config.batching_enabled
    assert config.dynamic_batching is None
    assert config.instance_groups == (InstanceGroup(name="m_0", count=1, kind="KIND_AUTO"),)
    assert config.instance_count == 1
    assert config.version_policy.kind == "latest" and config.version_policy.select([1, 2]) == (2,)
    assert config.parameters == {} and config.platform == "" and config.backend == ""
    assert config.default_model_filename == ""
    assert config.outputs[0].datatype == "BYTES" and config.outputs[0].dims == (-1,)


def test_tensor_lookup_by_name() -> None:
    config = _load(MINIMAL)
    assert config.input("x") is config.inputs[0]
    assert config.output("y") is config.outputs[0]
    assert config.input("y") is None and config.output("nope") is None


def test_empty_dynamic_batching_enables_defaults() -> None:
    config = _load(MINIMAL + " max_batch_size: 4 dynamic_batching { }")
    assert config.dynamic_batching == DynamicBatching()


def test_config_is_frozen() -> None:
    config = _load(MINIMAL)
    with pytest.raises(ValidationError):
        config.max_batch_size = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "policy", "available", "selected"),
    [
        ("", "latest", [3, 1, 2], (3,)),
        ("version_policy { latest { num_versions: 2 } }", "latest", [1, 2, 3], (2, 3)),
        ("version_policy { all { } }", "all", [2, 1], (1, 2)),
        ("version_policy: { specific: { versions: [ 1, 3 ] } }", "specific", [1, 2, 3], (1, 3)),
    ],
)
def test_version_policies(text: str, policy: str, available: list[int], selected: tuple[int, ...]) -> None:
    config = _load(MINIMAL + " " + text)
    assert config.version_policy.kind == policy
    assert config.version_policy.select(available) == selected


def test_to_json_is_tritons_form() -> None:
    body = _load(DENSENET).to_json()
    json.dumps(body)
    assert body["name"] == "densenet_onnx" and body["max_batch_size"] == 8
    assert body["input"][0]["data_type"] == "TYPE_FP32"
    assert body["input"][0]["dims"] == [3, 224, 224]
    assert body["input"][0]["reshape"] == {"shape": [3, 224, 224]}
    assert body["input"][0]["format"] == "FORMAT_NCHW"
    assert body["instance_group"][0] == {"name": "densenet_onnx_0", "kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}
    assert body["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert body["dynamic_batching"]["default_queue_policy"]["timeout_action"] == "DELAY"
    assert body["version_policy"] == {"latest": {"num_versions": 2}}
    assert body["parameters"]["intra_op_thread_count"] == {"string_value": "2"}
    assert body["model_warmup"][0]["inputs"]["data_0"]["zero_data"] is True


def test_to_json_of_a_minimal_config() -> None:
    body = _load(MINIMAL).to_json()
    assert "dynamic_batching" not in body
    assert body["output"][0]["data_type"] == "TYPE_STRING"
    assert body["version_policy"] == {"latest": {"num_versions": 1}}
    assert body["parameters"] == {} and body["backend"] == ""


def test_is_shape_tensor_is_ignored_with_a_warning() -> None:
    with capture_logs() as logs:
        _load('name: "m" input { name: "x" data_type: TYPE_INT32 dims: [1] is_shape_tensor: true }')
    assert [log["field"] for log in logs] == ["input[0].is_shape_tensor"]


def test_models_can_be_built_in_python_with_v2_names() -> None:
    config = ModelConfig(name="m", max_batch_size=2, inputs=[{"name": "x", "datatype": "FP32", "dims": [3]}])
    assert config.inputs[0].datatype == "FP32" and config.batching_enabled


BASE_IO = 'input { name: "a" data_type: TYPE_FP32 dims: [1] } output { name: "o" data_type: TYPE_FP32 dims: [1] }'


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ('max_batch_size: -1 ' + BASE_IO, "max_batch_size", "greater than or equal to 0"),
        ('max_batch_size: "8" ' + BASE_IO, "max_batch_size", "Couldn't parse integer"),
        ("max_batch_size: 1 max_batch_size: 2 " + BASE_IO, "max_batch_size", 'multiple "max_batch_size" fields'),
        (BASE_IO, "name", "Field required"),
        ('input [ { name: "a" data_type: TYPE_FP32 dims: [1] }, { name: "b" data_type: TYPE_NOPE dims: [1] } ]',
         "input[1].data_type", "TYPE_NOPE"),
        ('input { name: "a" data_type: TYPE_FP32 dims: [3, 0] }', "input[0].dims", "dimension 1 is 0"),
        ('input { name: "a" data_type: TYPE_FP32 dims: [-2] }', "input[0].dims", "dimension 0 is -2"),
        ('input { name: "a" data_type: TYPE_FP32 dims: [1, 2.5] }', "input[0].dims", "Couldn't parse integer: 2.5"),
        ('input { name: "a" data_type: TYPE_FP32 }', "input[0].dims", "Field required"),
        ('input { data_type: TYPE_FP32 dims: [1] }', "input[0].name", "Field required"),
        ('input [ { name: "a" data_type: TYPE_FP32 dims: [1] }, { name: "a" data_type: TYPE_FP32 dims: [1] } ]',
         "input[1].name", "duplicate input name 'a'"),
        ('output [ { name: "o" data_type: TYPE_FP32 dims: [1] }, { name: "o" data_type: TYPE_FP32 dims: [1] } ]',
         "output[1].name", "duplicate output name 'o'"),
        ('input { name: "a" data_type: TYPE_FP32 dims: [4] reshape { shape: [3] } }',
         "input[0].reshape.shape", "does not hold"),
        ("max_batch_size: 4 dynamic_batching { preferred_batch_size: [2, 8] }",
         "dynamic_batching.preferred_batch_size", "exceeds max_batch_size 4"),
        ("max_batch_size: 4 dynamic_batching { preferred_batch_size: [0] }",
         "dynamic_batching.preferred_batch_size[0]", "greater than or equal to 1"),
        ("max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
         "dynamic_batching.default_priority_level", "between 1 and priority_levels"),
        ("dynamic_batching { default_queue_policy { timeout_action: DROP } }",
         "dynamic_batching.default_queue_policy.timeout_action", "has no value named DROP"),
        ("dynamic_batching { max_queue_delay_microseconds: -5 }",
         "dynamic_batching.max_queue_delay_microseconds", "Value out of range: -5"),
        ("instance_group { count: -1 }", "instance_group[0].count", "greater than or equal to 1"),
        ("instance_group [ { count: 1 }, { kind: KIND_TPU } ]", "instance_group[1].kind", "KIND_TPU"),
        ("instance_group { kind: KIND_CPU gpus: [0] }", "instance_group[0].gpus", "cannot name GPUs"),
        ("instance_group { gpus: [-1] }", "instance_group[0].gpus[0]", "greater than or equal to 0"),
        ("version_policy { latest { num_versions: -1 } }", "version_policy.latest.num_versions", "out of range"),
        ("version_policy { latest { } all { } }", "version_policy.all", 'another member of oneof "policy_choice"'),
        ("version_policy { specific { versions: [] } }", "version_policy.specific.versions", "Field required"),
        ('parameters { key: "k" value: "v" }', "parameters.k", 'Expected "{"'),
        ('parameters { key: "k" value { string_value: 3 } }', "parameters.k.string_value",
         "Expected string but found: '3'"),
        ('parameters { key: [1] value { string_value: "v" } }', "parameters[0].key", "Expected string"),
        ("platform: 3", "platform", "Expected string but found: '3'"),
        ("dynamic_batching { preserve_ordering: 2 }", "dynamic_batching.preserve_ordering",
         'Expected "true" or "false"'),
        ("preserve_ordering: true", "preserve_ordering", 'has no field named "preserve_ordering"'),
    ],
)
def test_validation_errors_name_file_and_dotted_field(text: str, field: str, fragment: str) -> None:
    if field != "name":
        text = 'name: "m" ' + text
    with pytest.raises(ConfigError) as caught:
        _load(text)
    assert caught.value.field == field
    assert str(PATH) in str(caught.value) and f"'{field}'" in str(caught.value)
    assert fragment in str(caught.value)


def test_an_enum_given_by_its_number_is_read_as_triton_reads_it() -> None:
    config = _load('name: "m" input { name: "a" data_type: 7 dims: [1] }')  # 7 is TYPE_INT16
    assert config.inputs[0].datatype == "INT16"


def test_parse_config_file(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text(MINIMAL)
    assert parse_config_file(path).name == "m"
    path.write_text("name: ")
    with pytest.raises(ConfigError) as caught:
        parse_config_file(path)
    assert str(path) in str(caught.value) and "line 1, column 7" in str(caught.value)


def test_load_version_policy_alone() -> None:
    assert load_version_policy(PATH, None) == VersionPolicy()
    assert load_version_policy(PATH, {"all": {}}).kind == "all"
    with pytest.raises(ConfigError) as caught:
        load_version_policy(PATH, {"specific": {"versions": ["x"]}})
    assert caught.value.field == "version_policy.specific.versions[0]"


def test_fuzzed_configs_only_raise_config_error() -> None:
    rng = random.Random(11)
    words = ["{", "}", "[", "]", ":", "0", "-1", "2.5", '"x"', "TYPE_FP32", "KIND_CPU", "input", "dims", "name",
             "key", "value", "max_batch_size", "reshape", "latest", "specific", "parameters", "instance_group"]
    with capture_logs():
        for _ in range(1500):
            text = DENSENET.split(" ")
            for _ in range(rng.randrange(1, 4)):
                text.insert(rng.randrange(len(text)), rng.choice(words))
            try:
                _load(" ".join(text)).to_json()
            except ConfigError:
                pass


def test_every_committed_config_means_what_it_meant_to_the_hand_written_parser() -> None:
    # effective_configs.json: each model_repo config's to_json() as the pbtxt parser ferry had
    # before it read configs through Triton's own schema gave it.
    before = json.loads((Path(__file__).parent / "effective_configs.json").read_text())
    repository = ModelRepository(Path(__file__).resolve().parents[3] / "model_repo")
    assert {name: repository.entry(name).config.to_json() for name in before} == before
