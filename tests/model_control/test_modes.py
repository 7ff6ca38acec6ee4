"""Model control modes as Triton has them, through tritonclient against ``ferry serve``:
none and poll refuse load and unload, poll picks up a new version, explicit
loads only --load-model models, the management API can need a key, and
model_warmup runs before a model is ready (a failing warmup fails the load)."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.model_control.models import write_add_version, write_warmup_model
from tests.servers import ferry_serve

KEY = {"x-admin-key": "s3cret"}


def _add(client: httpclient.InferenceServerClient, value: float) -> tuple[str, np.ndarray]:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), value, dtype=np.float32))
    result = client.infer("adder", [tensor])
    return result.get_response()["model_version"], result.as_numpy("OUTPUT0")


def _ready_index(url: str) -> list[dict]:
    """Triton's ``{"ready": true}`` filter, which tritonclient does not send."""
    request = urllib.request.Request(f"http://{url}/v2/repository/index", data=b'{"ready": true}',
                                     headers={**KEY, "Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _refused(call, *args, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as refused:
        call(*args, **kwargs)
    return refused.value


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_load_and_unload_are_refused_unless_explicit(tmp_path: Path, mode: str) -> None:
    write_add_version(tmp_path, "adder", 1, 1.0)
    with ferry_serve(tmp_path, "--model-control-mode", mode) as url:
        with httpclient.InferenceServerClient(url) as client:
            for call in (client.load_model, client.unload_model):
                error = _refused(call, "adder")
                assert error.status() == "400" and "not allowed" in str(error) and mode in str(error), error
            assert client.is_model_ready("adder")
            assert [row["state"] for row in client.get_model_repository_index()] == ["READY"]


def test_poll_mode_serves_a_new_version_once_it_appears(tmp_path: Path) -> None:
    write_add_version(tmp_path, "adder", 1, 1.0)
    with ferry_serve(tmp_path, "--model-control-mode", "poll", "--repository-poll-secs", "0.2") as url:
        with httpclient.InferenceServerClient(url) as client:
            assert _add(client, 1.0)[0] == "1"
            write_add_version(tmp_path, "adder", 2, 2.0)
            deadline = time.monotonic() + 30
            while not client.is_model_ready("adder", "2") and time.monotonic() < deadline:
                time.sleep(0.1)
            version, output = _add(client, 1.0)
            assert version == "2"
            np.testing.assert_array_equal(output, np.full((1, 4), 3.0, dtype=np.float32))
            rows = client.get_model_repository_index()
            assert [(row["version"], row["state"]) for row in rows] == [("2", "READY")], rows


def test_explicit_mode_loads_only_what_it_is_told_behind_an_api_key(tmp_path: Path) -> None:
    marker = tmp_path / "warmup.txt"
    repo = tmp_path / "repo"
    write_add_version(repo, "adder", 1, 1.0)
    write_warmup_model(repo, "warm", marker)
    write_warmup_model(repo, "cold", tmp_path / "cold.txt", fail=True, sample="zeros-fail")
    with ferry_serve(repo, "--model-control-mode", "explicit", "--load-model", "adder",
                     "--http-restricted-api", "model-repository:X-Admin-Key=s3cret") as url:
        with httpclient.InferenceServerClient(url) as client:
            for call in (client.get_model_repository_index, lambda: client.load_model("warm"),
                         lambda: client.unload_model("adder"),
                         lambda: client.load_model("warm", headers={"x-admin-key": "wrong"})):
                error = _refused(call)
                assert error.status() == "403" and "x-admin-key" in str(error), error
            rows = {row["name"]: row["state"] for row in client.get_model_repository_index(headers=KEY)}
            assert rows == {"adder": "READY", "warm": "UNAVAILABLE", "cold": "UNAVAILABLE"}
            assert _ready_index(url) == [{"name": "adder", "version": "1", "state": "READY", "reason": ""}]
            assert not client.is_model_ready("warm") and not marker.exists()

            client.load_model("warm", headers=KEY)
            assert client.is_model_ready("warm")
            assert marker.read_text().split() == ["0", "0", "0"]  # the warmup ran, three times, before ready

            error = _refused(client.load_model, "cold", headers=KEY)
            assert error.status() == "400" and "warmup sample 'zeros-fail'" in str(error), error
            assert error.message().startswith("failed to load 'cold', "), error  # Triton's words
            assert not client.is_model_ready("cold")

            client.unload_model("adder", headers=KEY)
            assert not client.is_model_ready("adder")
            assert _refused(_add, client, 1.0).status() == "503"
            rows = {row["name"]: row for row in client.get_model_repository_index(headers=KEY)}
            assert rows["adder"]["state"] == "UNAVAILABLE" and rows["adder"]["reason"] == "unloaded"
            client.load_model("adder", headers=KEY)
            assert _add(client, 1.0)[0] == "1"
