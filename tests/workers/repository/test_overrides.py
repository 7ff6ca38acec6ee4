"""Load-request overrides: every parameter is checked before anything touches the disk."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from workers.control.messages import ControlMessage, decode_message, encode_message
from workers.repository.overrides import InvalidOverride, LoadOverrides, materialize, parse_load_parameters
from workers.repository.safe_paths import inside, path_problem

CONFIG = '{"name": "m", "max_batch_size": 0, "parameters": {"k": {"string_value": "v"}}, ' \
         '"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["4"]}]}'


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize("relative", [
    "../x", "1/../x", "/etc/passwd", "1//x", "1/a\\b", "1/.hidden", "1/a\x00b", "1/", "", "c:/x", "1/./x",
])
def test_unsafe_relative_paths_are_named(relative: str) -> None:
    assert path_problem(relative) is not None


def test_a_symlink_on_the_way_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "link").symlink_to(tmp_path / "out")
    with pytest.raises(ValueError, match="symlink"):
        inside(tmp_path / "base", "link/file")
    assert inside(tmp_path / "base", "sub/file") == (tmp_path / "base" / "sub" / "file").resolve()


@pytest.mark.parametrize(("parameters", "named"), [
    ({"config": CONFIG, "file:../x": _b64(b"x")}, "file:../x"),
    ({"config": CONFIG, "file:1/../../x": _b64(b"x")}, "file:1/../../x"),
    ({"config": CONFIG, "file:0/model.onnx": _b64(b"x")}, "file:0/model.onnx"),
    ({"config": CONFIG, "file:1/model.onnx": "not base64!"}, "file:1/model.onnx"),
    ({"file:1/model.onnx": _b64(b"x")}, "config"),
    ({"config": '{"name": "other"}'}, "config"),
    ({"config": "[1, 2]"}, "config"),
    ({"config": "{"}, "config"),
    ({"unload_dependents": "yes"}, "unload_dependents"),
    ({"path": "/etc"}, "path"),
])
def test_bad_parameters_are_refused_naming_the_parameter(parameters: dict, named: str) -> None:
    with pytest.raises(InvalidOverride) as refused:
        parse_load_parameters("m", parameters)
    assert refused.value.parameter == named and f"load parameter '{named}'" in str(refused.value)


def test_a_json_config_is_shaped_like_parsed_pbtxt() -> None:
    overrides = parse_load_parameters("m", {"config": CONFIG})
    assert overrides.config is not None
    assert overrides.config["parameters"] == [{"key": "k", "value": {"string_value": "v"}}]
    assert overrides.config["input"][0]["dims"] == [4]


def test_files_are_written_only_into_a_fresh_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    overrides = parse_load_parameters("m", {"config": CONFIG, "file:1/sub/model.onnx": _b64(b"abc")})
    written = materialize("m", overrides)
    assert written.model_dir is not None and written.owned_dir is not None
    assert written.owned_dir.parent == tmp_path and written.model_dir == written.owned_dir / "m"
    assert (written.model_dir / "1" / "sub" / "model.onnx").read_bytes() == b"abc"
    written.remove()
    assert not written.owned_dir.exists()


def test_overrides_travel_in_a_control_message_and_are_checked_again() -> None:
    overrides = parse_load_parameters("m", {"config": CONFIG, "file:1/model.onnx": _b64(b"\x00\x01")})
    message = ControlMessage("id1", "load", "m", "reply", 5, overrides)
    decoded = decode_message(encode_message(message))
    assert decoded.overrides.files == {"1/model.onnx": b"\x00\x01"} and decoded.overrides.config == overrides.config
    forged = ControlMessage("id2", "load", "m", "reply", 5, LoadOverrides(dict(overrides.config or {}),
                                                                           {"../../x": b"1"}))
    with pytest.raises(InvalidOverride):
        decode_message(encode_message(forged))
