"""SageMaker's routes as Triton's SageMaker mode answers them: /ping, /invocations
(JSON and binary bodies) and the multi-model /models endpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton

from ferry.wiring.settings import ServeSettings
from gateway.platforms.sagemaker import SageMakerSettings
from tests.gateway.platforms.conftest import V2_URL, copy_add_sub, serving
from tests.models import write_python_model
from workers.control.messages import ControlSettings
from gateway.management import ManagementSettings
from workers.worker import WorkerSettings

PORT = 8080
URL = f"http://ferry:{PORT}"
BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size="


def add_sub_inputs(rows: int = 2) -> tuple[np.ndarray, np.ndarray, list[triton.InferInput]]:
    a = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)
    b = np.full((rows, 16), 0.5, dtype=np.float32)
    tensors = [triton.InferInput("INPUT0", [rows, 16], "FP32"), triton.InferInput("INPUT1", [rows, 16], "FP32")]
    tensors[0].set_data_from_numpy(a)
    tensors[1].set_data_from_numpy(b)
    return a, b, tensors


def json_body(a: np.ndarray, b: np.ndarray) -> dict:
    return {"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
                       for name, x in (("INPUT0", a), ("INPUT1", b))]}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    copy_add_sub(tmp_path / "repo")
    return tmp_path / "repo"


async def test_ping_and_invocations_serve_the_default_model_in_json_and_binary(repo: Path) -> None:
    settings = ServeSettings(model_repository=repo, sagemaker=SageMakerSettings(port=PORT))
    async with serving(settings, PORT) as client:
        sagemaker, v2 = client(URL), client(V2_URL)
        assert (await sagemaker.get("/ping")).status_code == 200
        a, b, tensors = add_sub_inputs()
        answer = await sagemaker.post("/invocations", json=json_body(a, b))
        assert answer.status_code == 200, answer.text
        outputs = {o["name"]: np.array(o["data"], dtype=np.float32).reshape(o["shape"])
                   for o in answer.json()["outputs"]}
        np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
        np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)
        assert answer.json() == (await v2.post("/v2/models/add_sub/infer", json=json_body(a, b))).json()

        # Binary, as Triton's SageMaker examples build it with tritonclient.
        body, header_length = triton.InferenceServerClient.generate_request_body(
            tensors, outputs=[triton.InferRequestedOutput("OUTPUT0", binary_data=True)])
        answer = await sagemaker.post("/invocations", content=body,
                                      headers={"Content-Type": f"{BINARY}{header_length}"})
        assert answer.status_code == 200, answer.text
        content_type = answer.headers["content-type"]
        assert content_type.startswith(BINARY), content_type
        assert "inference-header-content-length" not in answer.headers
        result = triton.InferenceServerClient.parse_response_body(answer.content,
                                                                   header_length=int(content_type[len(BINARY):]))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)

        # Not the V2 port's routes, and not the platform's on the V2 port.
        assert (await sagemaker.get("/v2/health/ready")).status_code == 400
        assert (await v2.get("/ping")).status_code == 404


async def test_a_bad_binary_content_type_is_refused_with_triton_words(repo: Path) -> None:
    settings = ServeSettings(model_repository=repo, sagemaker=SageMakerSettings(port=PORT))
    async with serving(settings, PORT) as client:
        sagemaker = client(URL)
        a, b, _ = add_sub_inputs()
        for content_type, words in ((f"{BINARY}many", "Unable to parse inference header size"),
                                    (f"text/plain; {BINARY}10", "expect MIME type for binary data starts with"),
                                    (f"{BINARY}999999", "Inference-Header-Content-Length 999999 is larger")):
            answer = await sagemaker.post("/invocations", content=json.dumps(json_body(a, b)).encode(),
                                          headers={"Content-Type": content_type})
            assert answer.status_code == 400 and words in answer.json()["error"], (content_type, answer.text)


async def test_invocations_need_a_default_model_when_the_repository_has_several(repo: Path) -> None:
    copy_add_sub(repo, "other")
    settings = ServeSettings(model_repository=repo, sagemaker=SageMakerSettings(port=PORT))
    async with serving(settings, PORT) as client:
        a, b, _ = add_sub_inputs()
        answer = await client(URL).post("/invocations", json=json_body(a, b))
        assert answer.status_code == 400 and "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME" in answer.json()["error"]
    settings = ServeSettings(model_repository=repo, sagemaker=SageMakerSettings(port=PORT, default_model="other"))
    async with serving(settings, PORT) as client:
        assert (await client(URL).post("/invocations", json=json_body(a, b))).status_code == 200


OOM_MODEL = """
class Model:
    def infer(self, inputs):
        raise MemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
"""
OOM_CONFIG = """
name: "hungry"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


async def test_running_out_of_memory_is_a_507(tmp_path: Path) -> None:
    write_python_model(tmp_path, "hungry", OOM_MODEL, OOM_CONFIG)
    settings = ServeSettings(model_repository=tmp_path, sagemaker=SageMakerSettings(port=PORT))
    async with serving(settings, PORT) as client:
        body = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
        answer = await client(URL).post("/invocations", json=body)
        assert answer.status_code == 507 and "out of memory" in answer.json()["error"], answer.text
        assert (await client(V2_URL).post("/v2/models/hungry/infer", json=body)).status_code == 500


def mme_settings(repo: Path) -> ServeSettings:
    explicit = ControlSettings("explicit")
    return ServeSettings(model_repository=repo, management=ManagementSettings(explicit),
                         worker=WorkerSettings(control=explicit),
                         sagemaker=SageMakerSettings(port=PORT, multi_model=True))


async def test_multi_model_endpoints_load_list_invoke_and_unload(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    archive = tmp_path / "opt/ml/models/0123abcd/model"
    copy_add_sub(archive)  # SageMaker unpacks model.tar.gz here: one model directory inside
    async with serving(mme_settings(tmp_path / "repo"), PORT) as client:
        sagemaker, v2 = client(URL), client(V2_URL)
        assert (await sagemaker.get("/models")).json() == {"models": []}
        load = {"model_name": "0123abcd", "url": str(archive)}
        target = {"X-Amzn-SageMaker-Target-Model": "adder.tar.gz"}
        answer = await sagemaker.post("/models", json=load, headers=target)
        assert answer.status_code == 200, answer.text
        listed = {"modelName": "0123abcd", "modelUrl": str(archive)}
        assert (await sagemaker.get("/models")).json() == {"models": [listed]}
        assert (await sagemaker.get("/models/0123abcd")).json() == listed
        assert (await v2.get("/v2/models/adder.tar.gz/ready")).status_code == 200  # served under the target name

        a, b, tensors = add_sub_inputs(3)
        answer = await sagemaker.post("/models/0123abcd/invoke", json=json_body(a, b), headers=target)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model_name"] == "adder.tar.gz"
        body, header_length = triton.InferenceServerClient.generate_request_body(tensors)
        answer = await sagemaker.post("/models/0123abcd/invoke", content=body,
                                      headers={**target, "Content-Type": f"{BINARY}{header_length}"})
        result = triton.InferenceServerClient.parse_response_body(
            answer.content, header_length=int(answer.headers["content-type"][len(BINARY):]))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)

        again = await sagemaker.post("/models", json=load, headers=target)
        assert again.status_code == 409 and "already loaded" in again.json()["error"]

        assert (await sagemaker.delete("/models/0123abcd")).status_code == 200
        assert (await sagemaker.get("/models")).json() == {"models": []}
        assert (await sagemaker.get("/models/0123abcd")).status_code == 404
        assert (await sagemaker.post("/models/0123abcd/invoke", json=json_body(a, b))).status_code == 404
        assert (await sagemaker.delete("/models/0123abcd")).status_code == 404
        assert (await v2.get("/v2/models/adder.tar.gz/ready")).status_code != 200


async def test_an_ensemble_archive_loads_its_members_first_and_unloads_them_with_it(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    archive = tmp_path / "models/feed/model"
    copy_add_sub(archive, "inner")
    (archive / "pipeline/1").mkdir(parents=True)  # an ensemble's version directory, empty
    (archive / "pipeline/config.pbtxt").write_text("""
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [ { model_name: "inner" model_version: -1
  input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
  output_map { key: "OUTPUT0" value: "SUM" } } ] }
""")
    async with serving(mme_settings(tmp_path / "repo"), PORT) as client:
        sagemaker, v2 = client(URL), client(V2_URL)
        answer = await sagemaker.post("/models", json={"model_name": "feed", "url": str(archive)})
        assert answer.status_code == 200, answer.text
        a, b, _ = add_sub_inputs(2)
        body = {"inputs": [{"name": n, "shape": [2, 16], "datatype": "FP32", "data": x.ravel().tolist()}
                           for n, x in (("A", a), ("B", b))]}
        answer = await sagemaker.post("/models/feed/invoke", json=body)
        assert answer.status_code == 200, answer.text
        np.testing.assert_array_equal(np.array(answer.json()["outputs"][0]["data"], dtype=np.float32), (a + b).ravel())
        assert (await sagemaker.delete("/models/feed")).status_code == 200
        for name in ("feed", "inner"):
            assert (await v2.get(f"/v2/models/{name}/ready")).status_code != 200, name


@pytest.mark.parametrize(("body", "words"), [
    (b"not json", "not JSON"),
    (b'{"model_name": "m"}', "expected {\\\"model_name\\\""),
    (b'{"model_name": "m", "url": "/proc/self"}', "cannot be loaded from /dev/, /proc/ or /sys/"),
    (b'{"model_name": "m", "url": "/nowhere/at/all"}', "not a directory"),
])
async def test_a_bad_load_request_is_a_400_that_says_why(tmp_path: Path, body: bytes, words: str) -> None:
    async with serving(mme_settings(tmp_path), PORT) as client:
        answer = await client(URL).post("/models", content=body)
        assert answer.status_code == 400 and words in answer.text, answer.text
        assert (await client(URL).get("/models")).json() == {"models": []}


async def test_a_load_body_past_its_limit_is_a_413(tmp_path: Path) -> None:
    async with serving(mme_settings(tmp_path), PORT) as client:
        body = json.dumps({"model_name": "m", "url": "/x" * 40_000}).encode()
        answer = await client(URL).post("/models", content=body)
        assert answer.status_code == 413 and "65536-byte limit" in answer.json()["error"], answer.text


async def test_an_archive_whose_model_fails_to_load_leaves_nothing_listed(tmp_path: Path) -> None:
    archive = tmp_path / "models/bad/model"
    copy_add_sub(archive)
    (archive / "add_sub/1/model.onnx").write_bytes(b"not an onnx model")
    async with serving(mme_settings(tmp_path), PORT) as client:
        answer = await client(URL).post("/models", json={"model_name": "bad", "url": str(archive)})
        assert answer.status_code == 400 and "failed to load 'bad'" in answer.json()["error"], answer.text
        assert (await client(URL).get("/models")).json() == {"models": []}


def test_settings_come_from_sagemakers_environment_under_the_command_line() -> None:
    env = {"SAGEMAKER_BIND_TO_PORT": "9090", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "m",
           "SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_TRITON_PING_MODE": "live"}
    settings = SageMakerSettings.from_environment(env)
    found = (settings.port, settings.default_model, settings.multi_model, settings.ping_mode)
    assert found == (9090, "m", True, "live")
    assert SageMakerSettings.from_environment(env, port=7070, default_model=None).port == 7070
    with pytest.raises(ValueError, match="inference_type"):
        SageMakerSettings.from_environment({"SAGEMAKER_TRITON_INFERENCE_TYPE": "guess"})
