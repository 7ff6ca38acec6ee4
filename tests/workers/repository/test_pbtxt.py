import math
import random
from pathlib import Path

import pytest

from workers.errors import ConfigError
from workers.repository.pbtxt import parse, parse_file

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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: 42", 42),
        ("a: -7", -7),
        ("a: 0x1F", 31),
        ("a: 1.5", 1.5),
        ("a: -2.5e3", -2500.0),
        ("a: .5", 0.5),
        ("a: 3f", 3.0),
        ("a: true", True),
        ("a: False", False),
        ("a: TYPE_FP32", "TYPE_FP32"),
        ("a: KIND_GPU", "KIND_GPU"),
        ('a: "hello"', "hello"),
        ("a: 'single'", "single"),
        (r'a: "tab\tquote\"nl\n"', 'tab\tquote"nl\n'),
        (r"a: 'it\'s'", "it's"),
        (r'a: "\101\x42\u00e9"', "ABé"),
        ('a: "con" "cat"', "concat"),
        ('a: "héllo"', "héllo"),
    ],
)
def test_scalar_values(text: str, expected: object) -> None:
    assert parse(text, "c.pbtxt") == {"a": expected}


def test_infinities_and_nan_are_floats() -> None:
    parsed = parse("a: inf b: -inf c: nan", "c.pbtxt")
    assert parsed["a"] == math.inf and parsed["b"] == -math.inf and math.isnan(parsed["c"])


@pytest.mark.parametrize("text", ["m { x: 1 }", "m: { x: 1 }", "m < x: 1 >", "m: < x: 1 >"])
def test_message_spellings(text: str) -> None:
    assert parse(text, "c.pbtxt") == {"m": {"x": 1}}


def test_real_triton_config_structure() -> None:
    parsed = parse(DENSENET, "densenet/config.pbtxt")
    assert parsed["name"] == "densenet_onnx"
    assert parsed["input"][0]["dims"] == [3, 224, 224]
    assert parsed["input"][0]["reshape"] == {"shape": [1, 3, 224, 224]}
    assert parsed["output"][0]["label_filename"] == "densenet_labels.txt"
    assert parsed["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}]
    assert parsed["parameters"] == [{"key": "intra_op_thread_count", "value": {"string_value": "1"}}]


def test_repeated_fields_are_lists_even_when_written_once() -> None:
    parsed = parse('input { name: "x" dims: 3 } instance_group { count: 1 gpus: 0 }', "c.pbtxt")
    assert parsed == {"input": [{"name": "x", "dims": [3]}], "instance_group": [{"count": 1, "gpus": [0]}]}


def test_repeated_field_written_several_times_accumulates() -> None:
    parsed = parse("dims: 1 dims: [2, 3] dims: 4", "c.pbtxt")
    assert parsed == {"dims": [1, 2, 3, 4]}


def test_singular_field_given_twice_or_as_list_becomes_a_list() -> None:
    assert parse("max_batch_size: 1 max_batch_size: 2", "c.pbtxt") == {"max_batch_size": [1, 2]}
    assert parse("max_batch_size: [8]", "c.pbtxt") == {"max_batch_size": [8]}


def test_custom_repeated_schema() -> None:
    assert parse("x: 1", "c.pbtxt", repeated=frozenset({"x"})) == {"x": [1]}
    assert parse("dims: 1", "c.pbtxt", repeated=frozenset()) == {"dims": 1}


def test_list_of_messages_and_empty_list() -> None:
    parsed = parse('output [ { name: "a" }, { name: "b" } ] preferred_batch_size: []', "c.pbtxt")
    assert parsed == {"output": [{"name": "a"}, {"name": "b"}], "preferred_batch_size": []}


def test_comments_and_separators() -> None:
    text = "# leading\na: 1, # trailing\nb: 2;\nc { d: 3; e: 4, }  # done"
    assert parse(text, "c.pbtxt") == {"a": 1, "b": 2, "c": {"d": 3, "e": 4}}


def test_empty_text_is_an_empty_message() -> None:
    assert parse("", "c.pbtxt") == {}
    assert parse("  # only a comment\n", "c.pbtxt") == {}


@pytest.mark.parametrize(
    ("text", "position", "expected"),
    [
        ("a", "1:2", "expected ':' or '{' after field 'a'"),
        ("a:", "1:3", "expected a value for 'a'"),
        ("a {\n  b: 1\n", "3:1", "expected '}' to close the '{' opened at line 1:3"),
        ("a: [1, 2", "1:9", "expected ',' or ']'"),
        ("a: [1 2]", "1:7", "expected ',' or ']'"),
        ('a: "open', "1:4", "unterminated string"),
        ("}", "1:1", "expected a field name"),
        ("a: 3abc", "1:4", "unexpected character"),
        ("a: @", "1:4", "unexpected character '@'"),
        ("a 1", "1:3", "expected ':' or '{'"),
        ("a: }", "1:4", "expected a value for 'a'"),
        ('a: "\\xff"', "1:4", "not valid UTF-8"),
        ("a: " + "9" * 5000, "1:4", "too long"),
    ],
)
def test_syntax_errors_name_file_position_and_expectation(text: str, position: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text, "models/m/config.pbtxt")
    message = str(caught.value)
    assert "models/m/config.pbtxt" in message
    assert f"line {position}" in message
    assert expected in message


def test_syntax_error_names_the_enclosing_field() -> None:
    with pytest.raises(ConfigError) as caught:
        parse("input { dims: [1, ] }", "c.pbtxt")
    assert caught.value.field == "input.dims"


def test_deep_nesting_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nested deeper"):
        parse("a { " * 500 + "}" * 500, "c.pbtxt")


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
    tokens = ["a", "b", ":", "{", "}", "[", "]", "<", ">", ",", ";", "1", "-2", "1.5", '"s"', "'t'", "TYPE_FP32", "#c\n"]
    for _ in range(2000):
        _parse_or_config_error(" ".join(rng.choice(tokens) for _ in range(rng.randrange(20))))
