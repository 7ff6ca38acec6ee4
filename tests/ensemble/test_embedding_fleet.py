"""The embedding ensemble over a Redis fleet: a gateway and one worker process
per model, so every step is a hop over the broker from the ensemble's worker
to the worker serving that step's model, and back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from broker import channels
from tests.ensemble.embedding import ENSEMBLE, SENTENCES, STEP_MODELS, copy_models, cosine, reference_embeddings
from tests.fleet.processes import Fleet
from tests.redis_server import flushdb
from workers.ensemble.broker_caller import owner_id

REQUESTS = 4


def text_input(sentences: list[str]) -> httpclient.InferInput:
    tensor = httpclient.InferInput("TEXT", [len(sentences), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[s.encode()] for s in sentences], dtype=object))
    return tensor


def test_each_step_hops_over_redis_to_its_own_worker(redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    repo = copy_models(tmp_path / "repo")
    reference = reference_embeddings(SENTENCES)
    with Fleet(redis_url, repo, tmp_path) as fleet:
        gateway = fleet.gateway()
        # The ensemble's worker serves no step; each step model has a worker of its own.
        workers = {model: fleet.worker(f"w-{model}", "--models", model, wait=False)
                   for model in (ENSEMBLE, *STEP_MODELS)}
        for model, worker in workers.items():
            fleet.wait_heartbeat(f"w-{model}", worker)
            fleet.wait_model_ready(gateway, model)
        client = httpclient.InferenceServerClient(gateway.url)
        try:
            results = [client.infer(ENSEMBLE, [text_input(SENTENCES)]) for _ in range(REQUESTS)]
            for result in results:
                similarity = cosine(result.as_numpy("EMBEDDING"), reference)
                assert (similarity > 0.999).all(), similarity
            parameters = results[-1].get_response()["parameters"]
            assert {f"ensemble_step_ms.{m}" for m in STEP_MODELS} <= parameters.keys()

            with pytest.raises(InferenceServerException) as caught:
                client.infer(ENSEMBLE, [_bad_utf8()])
            assert caught.value.status() == "400", fleet.describe()
            assert "step 1 (model 'minilm_tokenizer')" in caught.value.message()
        finally:
            client.close()

        # Every step request went through its model's stream on Redis, once per
        # request (the bad one stopped at step 1), from the ensemble worker's
        # own reply stream.
        steps_reply = channels.reply_channel(owner_id(f"w-{ENSEMBLE}"))
        assert fleet.entries_added(channels.request_channel("minilm_tokenizer")) == REQUESTS + 1
        assert fleet.entries_added(channels.request_channel("minilm")) == REQUESTS
        assert fleet.entries_added(channels.request_channel("minilm_pooling")) == REQUESTS
        assert fleet.entries_added(steps_reply) == 3 * REQUESTS + 1
        # And each was computed where its model is served: the step workers'
        # logs record the loads, the ensemble worker loaded no step model.
        for model in STEP_MODELS:
            assert _loaded(fleet, f"w-{model}") == {model}
        assert _loaded(fleet, f"w-{ENSEMBLE}") == {ENSEMBLE}
        assert not any(p.errors() for p in fleet.processes), fleet.describe()


def _bad_utf8() -> httpclient.InferInput:
    tensor = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"\xff bad"]], dtype=object))
    return tensor


def _loaded(fleet: Fleet, worker_id: str) -> set[str]:
    (process,) = [p for p in fleet.processes if p.name.startswith(f"worker-{worker_id}-")]
    return {event["model"] for event in process.log_events() if event.get("event") == "model.ready"}
