"""config.pbtxt read as Triton reads it: protobuf's text format against Triton's
ModelConfig schema, into plain values, every failure a ConfigError naming the field."""

import random
from pathlib import Path

import pytest

from workers.errors import ConfigError
from workers.repository.pbtxt import field_at, parse, parse_file, parse_json

# As Triton's documentation writes a model's config (densenet_onnx, its quick-start model).
DENSENET = """
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape { shape: [ 1, 3, 224, 224 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1, 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
instance_group [ { count: 2, kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def test_a_triton_config_becomes_plain_values():
    assert parse(DENSENET, "c.pbtxt") == {
        "name": "densenet_onnx",
        "platform": "onnxruntime_onnx",
        "input": [{"name": "data_0", "data_type": "TYPE_FP32", "format": "FORMAT_NCHW", "dims": [3, 224, 224],
                   "reshape": {"shape": [1, 3, 224, 224]}}],
        "output": [{"name": "fc6_1", "data_type": "TYPE_FP32", "dims": [1000], "reshape": {"shape": [1, 1000, 1, 1]},
                    "label_filename": "densenet_labels.txt"}],
        "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
        "parameters": [{"key": "intra_op_thread_count", "value": {"string_value": "1"}}],
    }


@pytest.mark.parametrize("text", [
    'input { name: "a" dims: 4 } input { name: "b" dims: [1, 2] }',
    'input [ { name: "a" dims: [4] }, { name: "b", dims: 1 dims: 2 } ]',
    "input < name: 'a' dims: [ 4 ] > input: { name: \"b\" dims: [ 1, 2 ] } # a comment",
])
def test_every_spelling_protobuf_takes_is_taken(text):
    config = parse(text, "c.pbtxt")
    assert [(i["name"], i["dims"]) for i in config["input"]] == [("a", [4]), ("b", [1, 2])]


def test_a_message_set_but_empty_is_kept_and_defaults_are_left_out():
    assert parse("dynamic_batching { }\nmax_batch_size: 0", "c") == {"dynamic_batching": {}}
    assert parse("sequence_batching { direct { } }", "c") == {"sequence_batching": {"direct": {}}}
    assert parse("", "c") == {}


def test_maps_come_as_entries_in_key_order():
    text = 'parameters { key: "z" value { string_value: "1" } } parameters { key: "a" value { string_value: "2" } }'
    assert [entry["key"] for entry in parse(text, "c")["parameters"]] == ["a", "z"]


@pytest.mark.parametrize(("text", "field", "fragment"), [
    ('name: "m"\nbogus: 1', "bogus", 'has no field named "bogus" (line 2, column 1)'),
    ('input [ { name: "a" data_type: TYPE_FP32 }, { name: "b" data_type: FP32 } ]', "input[1].data_type",
     "has no value named FP32"),
    ('max_batch_size: "8"', "max_batch_size", "Couldn't parse integer"),
    ("max_batch_size: 8 max_batch_size: 9", "max_batch_size", 'multiple "max_batch_size" fields'),
    ("dynamic_batching { max_queue_delay_microseconds: -5 }", "dynamic_batching.max_queue_delay_microseconds",
     "out of range"),
    ("instance_group [ { count: 1 }, { kind: KIND_TPU } ]", "instance_group[1].kind", "KIND_TPU"),
    ('input { name: "a" } input { name: "b" shape: [1] }', "input[1].shape", 'no field named "shape"'),
    ('ensemble_scheduling { step [ { model_name: "a" }, { model_nme: "b" } ] }', "ensemble_scheduling.step[1].model_nme",
     "no field named"),
    ("dynamic_batching {\n  preferred_batch_size: [ 4\n", "dynamic_batching.preferred_batch_size", "Expected"),
    ("version_policy { latest { num_versions: x } }", "version_policy.latest.num_versions", "integer"),
    ("dynamic_batching { }\nsequence_batching { direct { } }", "sequence_batching", 'oneof "scheduling_choice"'),
])
def test_what_triton_refuses_is_refused_naming_file_and_field(text, field, fragment):
    with pytest.raises(ConfigError) as caught:
        parse(text, "m/config.pbtxt")
    assert caught.value.field == field
    assert str(caught.value).startswith(f"m/config.pbtxt: field '{field}': ") and fragment in str(caught.value)


def test_the_field_at_a_position_counts_repeated_messages_however_written():
    text = 'input { name: "a" }\ninput [ { name: "b" }, { name: "c" dims: [1] } ]'
    assert field_at(text, 2, 42) == "input[2].dims"
    assert field_at(text, 1, 9, unknown="oops") == "input[0].oops"


@pytest.mark.parametrize(("body", "expected"), [
    ('{"name": "m", "max_batch_size": "16", "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["3", 4]}]}',
     {"name": "m", "max_batch_size": 16, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3, 4]}]}),
    ('{"maxBatchSize": 2, "parameters": {"k": {"string_value": "v"}}}',
     {"max_batch_size": 2, "parameters": [{"key": "k", "value": {"string_value": "v"}}]}),
])
def test_a_json_config_is_read_with_protobufs_json_rules(body, expected):
    assert parse_json(body, "config") == expected


@pytest.mark.parametrize(("body", "field"), [
    ('{"max_batch_size": "many"}', "max_batch_size"),
    ('{"bogus": 1}', "bogus"),
    ('{"input": [{"data_type": "FP32"}]}', "input"),
    ("not json", "(config)"),
])
def test_a_bad_json_config_is_refused(body, field):
    with pytest.raises(ConfigError) as caught:
        parse_json(body, "config")
    assert caught.value.field == field


def test_parse_file_reads_and_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "m"')
    assert parse_file(path) == {"name": "m"}


def test_parse_file_rejects_invalid_utf8_and_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_bytes(b'name: "\xff"')
    with pytest.raises(ConfigError, match="UTF-8"):
        parse_file(path)
    with pytest.raises(ConfigError, match="cannot read"):
        parse_file(tmp_path / "absent.pbtxt")


def _parse_or_config_error(text: str) -> None:
    try:
        parse(text, "fuzz.pbtxt")
    except ConfigError:
        pass


def test_fuzz_random_bytes_only_raise_config_error() -> None:
    rng = random.Random(1234)
    for _ in range(500):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        _parse_or_config_error(raw.decode("utf-8", errors="surrogateescape"))
        _parse_or_config_error(raw.decode("latin-1"))


def test_fuzz_truncations_and_mutations_only_raise_config_error() -> None:
    rng = random.Random(99)
    for cut in range(len(DENSENET)):
        _parse_or_config_error(DENSENET[:cut])
    alphabet = list('{}[]<>:;,"\'\\#-.0123456789abcxTYPE_ \n\x00')
    for _ in range(1000):
        chars = list(DENSENET)
        for _ in range(rng.randrange(1, 5)):
            chars[rng.randrange(len(chars))] = rng.choice(alphabet)
        _parse_or_config_error("".join(chars))


def test_fuzz_token_soup_only_raises_config_error() -> None:
    rng = random.Random(7)
    tokens = ["name", "input", "dims", ":", "{", "}", "[", "]", "<", ">", ",", ";", "1", "-2", "1.5", '"s"', "'t'",
              "TYPE_FP32", "#c\n"]
    for _ in range(2000):
        _parse_or_config_error(" ".join(rng.choice(tokens) for _ in range(rng.randrange(20))))
