"""``ferry serve`` with SageMaker's and Vertex AI's contracts over real HTTP, switched
on by flag or by the environment each platform sets for its containers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton

from tests.servers import ferry_serve, free_port

MODEL_REPO = Path(__file__).resolve().parents[1] / "model_repo"
SAGEMAKER_BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size="


def request(url: str, method: str = "GET", body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    sent = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(sent, timeout=60) as answer:
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def retried(url: str, body: bytes, deadline_s: float = 30.0) -> tuple[int, bytes]:
    """POST ``body`` as JSON, again after a 503 (with its ``Retry-After``), as a client of a fleet
    does: on a starved host a gateway may miss a worker's heartbeat for a moment."""
    deadline = time.monotonic() + deadline_s
    while True:
        status, headers, answer = request(url, "POST", body, {"Content-Type": "application/json"})
        if status != 503 or time.monotonic() > deadline:
            return status, answer
        time.sleep(float(headers.get("retry-after", "0.2")))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "repo/add_sub")
    return tmp_path / "repo"


def binary_add_sub(url: str, rows: int, headers: dict[str, str] | None = None) -> tuple[np.ndarray, Any]:
    """``rows`` rows of add_sub (each input the same array) posted to ``url`` as SageMaker's binary
    body, as Triton's SageMaker examples build it with tritonclient; the array and the parsed answer."""
    a = np.random.default_rng(rows).random((rows, 16), dtype=np.float32)
    tensors = [triton.InferInput(n, [rows, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in tensors:
        tensor.set_data_from_numpy(a)
    body, header_length = triton.InferenceServerClient.generate_request_body(tensors)
    status, answered, answer = request(url, "POST", body,
                                       {**(headers or {}), "Content-Type": f"{SAGEMAKER_BINARY}{header_length}"})
    assert status == 200, answer
    return a, triton.InferenceServerClient.parse_response_body(
        answer, header_length=int(answered["content-type"][len(SAGEMAKER_BINARY):]))


def test_sagemaker_ping_and_binary_invocations_on_their_own_port(repo: Path) -> None:
    port = free_port()
    with ferry_serve(repo, "--sagemaker", "--sagemaker-port", str(port)) as url:
        sagemaker = f"http://127.0.0.1:{port}"
        assert request(f"{sagemaker}/ping")[0] == 200
        a, result = binary_add_sub(f"{sagemaker}/invocations", 3)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
        assert request(f"http://{url}/v2/health/ready")[0] == 200  # the V2 port serves as ever


def test_sagemakers_environment_turns_on_multi_model_endpoints(repo: Path, tmp_path: Path) -> None:
    port = free_port()
    archive = tmp_path / "opt/ml/models/a1b2/model"
    shutil.copytree(MODEL_REPO / "add_sub", archive / "add_sub")
    env = {"SAGEMAKER_BIND_TO_PORT": str(port), "SAGEMAKER_MULTI_MODEL": "true"}
    with ferry_serve(tmp_path / "repo", env=env):  # no flag: the environment says SageMaker, model control explicit
        sagemaker = f"http://127.0.0.1:{port}"
        load = json.dumps({"model_name": "a1b2", "url": str(archive)}).encode()
        status, _, body = request(f"{sagemaker}/models", "POST", load,
                                  {"X-Amzn-SageMaker-Target-Model": "add_sub.tar.gz"})
        assert status == 200, body
        listed = {"models": [{"modelName": "a1b2", "modelUrl": str(archive)}]}
        assert json.loads(request(f"{sagemaker}/models")[2]) == listed
        a, result = binary_add_sub(f"{sagemaker}/models/a1b2/invoke", 2)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros_like(a))
        assert request(f"{sagemaker}/models/a1b2", "DELETE")[0] == 200
        assert json.loads(request(f"{sagemaker}/models")[2]) == {"models": []}


def test_vertex_ai_environment_serves_predictions_from_two_http_processes(repo: Path) -> None:
    port = free_port()
    env = {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port), "AIP_HEALTH_ROUTE": "/health",
           "AIP_PREDICT_ROUTE": "/predict"}
    with ferry_serve(repo, "--http-workers", "2", env=env):
        vertex = f"http://127.0.0.1:{port}"
        # As Vertex does before it sends traffic: health until every process says ready (each
        # new connection may reach either; a process that has not yet seen the worker answers 503).
        deadline, healthy = time.monotonic() + 60, 0
        while healthy < 8:
            assert time.monotonic() < deadline, "the Vertex health route never answered 200 eight times running"
            healthy = healthy + 1 if request(f"{vertex}/health")[0] == 200 else 0
        rows = np.arange(20 * 16, dtype=np.float32).reshape(20, 16)
        instances = json.dumps({"instances": [{"INPUT0": row.tolist(), "INPUT1": row.tolist()} for row in rows]})
        for _ in range(4):  # new connections, spread over both processes by the kernel
            status, body = retried(f"{vertex}/predict", instances.encode())
            assert status == 200, body
            predictions = json.loads(body)["predictions"]
            assert [p["OUTPUT0"] for p in predictions] == (rows * 2).tolist()


@pytest.mark.parametrize(("extra", "env", "words"), [
    (["--sagemaker", "--sagemaker-port", "{http}"], {}, "the HTTP port and the platform ports must differ"),
    (["--vertex-ai"], {"AIP_HEALTH_ROUTE": "/health"}, "AIP_PREDICT_ROUTE is not set"),
    (["--sagemaker", "--http-workers", "2"], {"SAGEMAKER_MULTI_MODEL": "true"}, "need --http-workers 1"),
    (["--sagemaker"], {"SAGEMAKER_TRITON_PING_MODE": "sometimes"}, "ping_mode"),
])
def test_a_platform_set_up_wrong_stops_the_command_saying_why(repo: Path, extra: list[str], env: dict[str, str],
                                                              words: str) -> None:
    http = str(free_port())
    command = [sys.executable, "-m", "ferry.cli.main", "serve", "--model-repository", str(repo), "--host", "127.0.0.1",
               "--http-port", http, "--grpc-port", "0", *(arg.format(http=http) for arg in extra)]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "AIP_"))}
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env={**clean, **env})
    assert done.returncode != 0 and words in done.stderr, done.stderr
