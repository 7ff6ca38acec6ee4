"""Vertex AI's routes: health, and predict with ``instances`` in and ``predictions``
out, plus the V2 bodies and the redirect header Triton's Vertex AI mode takes."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton

from ferry.wiring.settings import ServeSettings
from gateway.platforms.vertex import VertexSettings
from tests.gateway.platforms.conftest import V2_URL, copy_add_sub, serving
from tests.models import write_identity_model

PORT = 8080
URL = f"http://ferry:{PORT}"
HEALTH, PREDICT = "/v1/endpoints/e1/deployedModels/d1", "/v1/endpoints/e1/deployedModels/d1:predict"
BINARY = "application/vnd.vertex-ai-triton.binary+json;json-header-size="


def vertex(repo: Path, default_model: str = "") -> ServeSettings:
    return ServeSettings(model_repository=repo, vertex=VertexSettings(
        port=PORT, health_route=HEALTH, predict_route=PREDICT, default_model=default_model))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    copy_add_sub(tmp_path)
    write_identity_model(tmp_path, "words", ["BYTES"])
    write_identity_model(tmp_path, "whole", ["FP32"], max_batch_size=0)
    return tmp_path


async def test_instances_are_batched_to_the_model_and_each_gets_its_prediction(repo: Path) -> None:
    async with serving(vertex(repo, "add_sub"), PORT) as client:
        platform = client(URL)
        assert (await platform.get(HEALTH)).status_code == 200
        rows = np.arange(10 * 16, dtype=np.float32).reshape(10, 16) / 4  # 10 rows: batches of 8 and 2
        instances = [{"INPUT0": row.tolist(), "INPUT1": [1.0] * 16} for row in rows]
        answer = await platform.post(PREDICT, json={"instances": instances})
        assert answer.status_code == 200, answer.text
        predictions = answer.json()["predictions"]
        assert len(predictions) == 10
        for row, prediction in zip(rows, predictions):
            assert prediction == {"OUTPUT0": (row + 1).tolist(), "OUTPUT1": (row - 1).tolist()}


async def test_a_one_input_model_takes_bare_values_strings_and_base64(repo: Path) -> None:
    async with serving(vertex(repo, "words"), PORT) as client:
        platform = client(URL)
        eps = {"b64": base64.b64encode(b"eps").decode()}
        instances = [["alpha", "beta"], {"IN_BYTES": ["gamma", "δέλτα"]}, [eps, "zeta"]]
        answer = await platform.post(PREDICT, json={"instances": instances})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"predictions": [["alpha", "beta"], ["gamma", "δέλτα"], ["eps", "zeta"]]}


async def test_a_model_without_batching_gets_one_request_per_instance(repo: Path) -> None:
    async with serving(vertex(repo, "whole"), PORT) as client:
        answer = await client(URL).post(PREDICT, json={"instances": [[1.0, 2.0, 3.0], [4.5]]})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"predictions": [[1.0, 2.0, 3.0], [4.5]]}


async def test_v2_bodies_binary_bodies_and_redirects_as_triton_takes_them(repo: Path) -> None:
    async with serving(vertex(repo, "add_sub"), PORT) as client:
        platform, v2 = client(URL), client(V2_URL)
        a = np.ones((2, 16), dtype=np.float32)
        body = {"inputs": [{"name": n, "shape": [2, 16], "datatype": "FP32", "data": a.ravel().tolist()}
                           for n in ("INPUT0", "INPUT1")]}
        answer = await platform.post(PREDICT, json=body)
        direct = await v2.post("/v2/models/add_sub/infer", json=body)
        assert answer.status_code == 200 and answer.json() == direct.json()

        tensors = [triton.InferInput(n, [2, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in tensors:
            tensor.set_data_from_numpy(a)
        raw, header_length = triton.InferenceServerClient.generate_request_body(tensors)
        answer = await platform.post(PREDICT, content=raw, headers={"Content-Type": f"{BINARY}{header_length}"})
        assert answer.status_code == 200, answer.text
        result = triton.InferenceServerClient.parse_response_body(
            answer.content, header_length=int(answer.headers["content-type"][len(BINARY):]))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)

        # A JSON body that asks for a binary output gets it with its header length in Vertex's content type.
        asked = {**body, "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
        answer = await platform.post(PREDICT, json=asked)
        assert answer.status_code == 200 and answer.headers["content-type"].startswith(BINARY), answer.headers
        result = triton.InferenceServerClient.parse_response_body(
            answer.content, header_length=int(answer.headers["content-type"][len(BINARY):]))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)

        redirect = {"X-Vertex-Ai-Triton-Redirect": "v2/models/whole/config"}
        answer = await platform.post(PREDICT, headers=redirect)
        assert answer.status_code == 200 and answer.json()["name"] == "whole"
        body = {"inputs": [{"name": "IN_FP32", "shape": [2], "datatype": "FP32", "data": [7.0, 8.0]}]}
        answer = await platform.post(PREDICT, json=body,
                                     headers={"X-Vertex-Ai-Triton-Redirect": "v2/models/whole/infer"})
        assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [7.0, 8.0]
        ready = await platform.post(PREDICT, headers={"X-Vertex-Ai-Triton-Redirect": "v2/health/ready"})
        assert ready.status_code == 200
        assert (await platform.get(PREDICT)).status_code == 400  # Vertex posts; nothing else is routed
        assert (await v2.get(HEALTH)).status_code == 404


@pytest.mark.parametrize(("model", "body", "words"), [
    ("add_sub", b"{not json", "not JSON"),
    ("add_sub", json.dumps({"instances": []}).encode(), "'instances' must be a non-empty array"),
    ("add_sub", json.dumps({"instances": [[1.0] * 16]}).encode(), "each instance must be an object"),
    ("add_sub", json.dumps({"instances": [{"INPUT0": [1.0] * 16, "INPUT9": [1.0]}]}).encode(),
     "unknown input 'INPUT9'"),
    ("add_sub", json.dumps({"instances": [{"INPUT0": [1.0] * 16}]}).encode(), "no value for input 'INPUT1'"),
    ("add_sub", json.dumps({"instances": [{"INPUT0": [1.0] * 16, "INPUT1": [1.0] * 16}],
                            "extra": 1}).encode(), "unknown field 'extra'"),
    ("add_sub", json.dumps({"instances": [{"INPUT0": ["x"] * 16, "INPUT1": [1.0] * 16}]}).encode(),
     "FP32 data must be numbers"),
    ("add_sub", json.dumps({"instances": [{"INPUT0": [1.0] * 16, "INPUT1": [1.0] * 16},
                                          {"INPUT0": [1.0] * 15, "INPUT1": [1.0] * 16}]}).encode(),
     "instances batched together must agree"),
    ("whole", json.dumps({"instances": [[[1.0], [2.0, 3.0]]]}).encode(), "is not rectangular"),
    ("words", json.dumps({"instances": [[{"b64": "***"}]]}).encode(), "'b64' is not valid base64"),
    ("words", json.dumps({"instances": [[7]]}).encode(), "expected strings or"),
])
async def test_a_bad_prediction_request_is_a_400_naming_what_is_wrong(repo: Path, model: str, body: bytes,
                                                                      words: str) -> None:
    async with serving(vertex(repo, model), PORT) as client:
        answer = await client(URL).post(PREDICT, content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == 400 and words in answer.json()["error"], answer.text


async def test_without_a_default_model_a_repository_of_several_is_refused(repo: Path) -> None:
    async with serving(vertex(repo), PORT) as client:
        answer = await client(URL).post(PREDICT, json={"instances": [[1.0]]})
        assert answer.status_code == 400 and "--vertex-ai-default-model" in answer.json()["error"]


def test_settings_come_from_the_environment_vertex_sets() -> None:
    env = {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "8095", "AIP_HEALTH_ROUTE": HEALTH, "AIP_PREDICT_ROUTE": PREDICT}
    settings = VertexSettings.from_environment(env)
    assert (settings.port, settings.health_route, settings.predict_route) == (8095, HEALTH, PREDICT)
    with pytest.raises(ValueError, match="AIP_PREDICT_ROUTE is not set"):
        VertexSettings.from_environment({"AIP_HEALTH_ROUTE": HEALTH})
