"""The text-embedding ensemble end to end: ``ferry serve`` on the three step
models and the ``embed`` ensemble, driven by the official tritonclient, checked
against sentence-transformers running the same weights in PyTorch."""

from __future__ import annotations


import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.ensemble.embedding import SENTENCES, copy_models, cosine, reference_embeddings
from tests.servers import ferry_serve


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return reference_embeddings(SENTENCES)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory):
    repo = copy_models(tmp_path_factory.mktemp("repo"))
    log = tmp_path_factory.mktemp("logs") / "serve.log"
    with ferry_serve(repo, log_path=log) as url:
        client = httpclient.InferenceServerClient(url, concurrency=8)
        try:
            yield client
        finally:
            client.close()


def text_input(sentences: list[str]) -> httpclient.InferInput:
    tensor = httpclient.InferInput("TEXT", [len(sentences), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[s.encode()] for s in sentences], dtype=object))
    return tensor


def test_embeddings_match_sentence_transformers_for_every_sentence(client, reference: np.ndarray):
    result = client.infer("embed", [text_input(SENTENCES)])
    embeddings = result.as_numpy("EMBEDDING")
    assert embeddings.shape == (len(SENTENCES), 384) and embeddings.dtype == np.float32
    similarity = cosine(embeddings, reference)
    assert (similarity > 0.999).all(), dict(zip(SENTENCES, similarity.round(5)))
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)


def test_concurrent_single_sentences_match_too(client, reference: np.ndarray):
    pending = [client.async_infer("embed", [text_input([sentence])]) for sentence in SENTENCES * 2]
    embeddings = np.stack([request.get_result().as_numpy("EMBEDDING")[0] for request in pending])
    similarity = cosine(embeddings, np.concatenate([reference, reference]))
    assert (similarity > 0.999).all(), similarity.round(5)


def test_the_response_reports_each_steps_latency(client):
    result = client.infer("embed", [text_input(["latency"])])
    parameters = result.get_response()["parameters"]
    for model in ("minilm_tokenizer", "minilm", "minilm_pooling"):
        assert parameters[f"ensemble_step_ms.{model}"] > 0
    assert parameters["ensemble_ms"] >= parameters["ensemble_step_ms.minilm"]


def test_metadata_and_config_describe_the_ensemble(client):
    metadata = client.get_model_metadata("embed")
    assert metadata["platform"] == "ensemble"
    assert metadata["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
    assert metadata["outputs"] == [{"name": "EMBEDDING", "datatype": "FP32", "shape": [-1, 384]}]
    config = client.get_model_config("embed")
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["minilm_tokenizer", "minilm", "minilm_pooling"]
    assert steps[2]["input_map"] == {"TOKEN_EMBEDDINGS": "token_embeddings", "ATTENTION_MASK": "attention_mask"}
    assert client.is_model_ready("embed")


def test_text_that_is_not_utf8_is_a_400_naming_the_step(client):
    tensor = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"\xff\xfe bad"]], dtype=object))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("embed", [tensor])
    assert caught.value.status() == "400"
    assert "ensemble 'embed' step 1 (model 'minilm_tokenizer')" in caught.value.message()
    assert "not valid UTF-8" in caught.value.message()
    assert client.infer("embed", [text_input(["still serving"])]).as_numpy("EMBEDDING").shape == (1, 384)


def test_a_wrong_datatype_is_a_400_from_the_ensemble_itself(client):
    tensor = httpclient.InferInput("TEXT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("embed", [tensor])
    assert caught.value.status() == "400" and "datatype FP32" in caught.value.message()
