"""No model name, version or ``file:`` override in a load request reaches
outside the repository, or outside the temporary directory ferry writes
overrides into. Each attempt is refused with 400 naming what is wrong, and
the files around the repository are the same afterwards: a canary beside the
repository is untouched, nothing new appears, no override directory is left.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.model_control.models import ADD_CONFIG, add_model_bytes, write_add_version
from tests.servers import ferry_serve

CANARY = b"canary: must never be read into a model or overwritten\n"
ONNX_CONFIG = json.dumps({"name": "adder", "platform": "onnxruntime_onnx", "max_batch_size": 8,
                          "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
                          "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]})


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every file and folder under ``root``; in ``tmp/`` only ferry's override directories
    (libraries keep files of their own there)."""
    found: dict[str, bytes | None] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            relative = path.relative_to(root).parts
            if relative[0] == "tmp" and len(relative) > 1 and not relative[1].startswith("ferry-override-"):
                continue
            found[str(path.relative_to(root))] = path.read_bytes() if path.is_file() else None
    return found


def _post(url: str, path: str, body: dict | None = None) -> tuple[int, str]:
    """A raw POST, so the path reaches the server exactly as written (tritonclient would quote it)."""
    host, port = url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("POST", path, body=json.dumps(body or {}), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


RAW_PATHS = [
    "/v2/repository/models/../outside/load",
    "/v2/repository/models/..%2Foutside/load",
    "/v2/repository/models/..%2F..%2Fcanary.txt/load",
    "/v2/repository/models/%2E%2E/load",
    "/v2/repository/models/%2Fetc%2Fpasswd/load",
    "/v2/repository/models/.hidden/load",
    "/v2/repository/models/adder%00/load",
    "/v2/repository/models/adder%5C..%5Cx/load",
    "/v2/repository/models/escape/load",
    "/v2/repository/models/..%2Foutside/unload",
]

FILE_OVERRIDES = [
    "file:../../canary.txt",
    "file:1/../../canary.txt",
    "file:1/../../../outside/model.onnx",
    "file:/etc/passwd",
    "file:1//tmp/x",
    "file:1/sub\\..\\..\\x",
    "file:1/.hidden",
    "file:1/a\x00b",
    "file:0/model.onnx",
    "file:model.onnx",
    "file:1/",
]


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    repo = tmp_path / "repo"
    write_add_version(repo, "adder", 1, 1.0)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "config.pbtxt").write_text(ADD_CONFIG.format(name="outside"))
    (tmp_path / "canary.txt").write_bytes(CANARY)
    (repo / "escape").symlink_to(tmp_path / "outside", target_is_directory=True)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # where ferry serve writes override directories
    return tmp_path


def test_traversal_attempts_are_refused_and_touch_nothing(layout: Path) -> None:
    repo = layout / "repo"
    before = _tree(layout)
    with ferry_serve(repo, "--model-control-mode", "explicit", "--load-model", "adder") as url:
        with httpclient.InferenceServerClient(url) as client:
            for path in RAW_PATHS:
                status, body = _post(url, path)
                assert status == 400, (path, status, body)
                assert "error" in json.loads(body), body
            for name in ("../outside", "..", ".hidden", "escape", "nope"):
                with pytest.raises(InferenceServerException) as refused:
                    client.load_model(name)
                assert refused.value.status() == "400", (name, refused.value)
            for key in FILE_OVERRIDES:
                status, body = _post(url, "/v2/repository/models/adder/load", {"parameters": {
                    "config": ONNX_CONFIG, key: base64.b64encode(b"not a model").decode()}})
                assert status == 400, (key, status, body)
                assert "load parameter 'file:" in body, (key, body)
            _refused_configs(client)
            assert client.is_model_ready("adder", "1")
    assert _tree(layout) == before
    assert (layout / "canary.txt").read_bytes() == CANARY


def _refused_configs(client: httpclient.InferenceServerClient) -> None:
    config = json.loads(ONNX_CONFIG)
    cases = [
        ({**config, "name": "other"}, "differs from the model being loaded"),
        ({**config, "name": "../adder"}, "differs from the model being loaded"),
        ({**config, "default_model_filename": "../../canary.txt"}, "default_model_filename"),
        ({**config, "model_warmup": [{"name": "w", "batch_size": 1, "inputs": {"INPUT0": {
            "data_type": "TYPE_FP32", "dims": [4], "input_data_file": "../../../canary.txt"}}}]},
         "must stay inside the model's warmup/ directory"),
    ]
    for body, reason in cases:
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("adder", config=json.dumps(body))
        assert refused.value.status() == "400" and reason in str(refused.value), refused.value
    with pytest.raises(InferenceServerException) as files_alone:
        client.load_model("adder", files={"file:1/model.onnx": b"x"})
    assert "need a config override" in str(files_alone.value)


def test_file_overrides_are_served_from_a_directory_ferry_owns(layout: Path) -> None:
    repo = layout / "repo"
    before = _tree(repo)
    with ferry_serve(repo, "--model-control-mode", "explicit", "--load-model", "adder") as url:
        with httpclient.InferenceServerClient(url) as client:
            client.load_model("adder", config=ONNX_CONFIG, files={"file:7/model.onnx": add_model_bytes(7.0)})
            written = [p for p in (layout / "tmp").glob("ferry-override-*/**/*") if p.is_file()]
            # The gateway reads the model from its own copy (its config), the worker serves its own.
            assert written and {p.relative_to(layout / "tmp").parts[1:] for p in written} == {("adder", "7", "model.onnx")}
            tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
            result = client.infer("adder", [tensor])
            assert result.get_response()["model_version"] == "7"
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), 7.0, dtype=np.float32))
            client.load_model("adder")  # back to the repository's files: the override directory goes
            assert client.is_model_ready("adder", "1")
            assert not any((layout / "tmp").glob("ferry-override-*"))
    assert _tree(repo) == before
