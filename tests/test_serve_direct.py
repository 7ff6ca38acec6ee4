"""``ferry serve`` on its embedded broker hands a plain request straight to its worker
(``gateway.service``'s ``LocalWorker``); what needs the broker still crosses it.

A watching consumer group of the test's own, made before any request, reads the model's
request channel: whatever was published there, it sees."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from broker import channels
from broker.envelope import Response
from broker.transports.memory import MemoryTransport
from ferry.cli.main import build_parser
from ferry.cli.settings import serve_settings
from ferry.wiring.serve import Serving, build_serving
from ferry.wiring.settings import ServeSettings
from gateway.errors import UpstreamTimeout
from gateway.service import ServiceSettings
from gateway.v2_codec import ParsedInfer, parse_infer_request
from tests.models import write_countdown_model, write_slow_model
from workers.datatypes import decode_array

MODEL_REPO = Path(__file__).resolve().parents[1] / "model_repo"
WATCH = "test.watch"


def repo_of(root: Path, *models: str) -> Path:
    """A repository of ``models``: from model_repo, ``add_sub_queued`` (add_sub with a
    max_queue_size), ``countdown`` (decoupled) and ``slow`` (0.5 s a request)."""
    for model in models:
        if model == "add_sub_queued":
            queued = root / model
            shutil.copytree(MODEL_REPO / "add_sub", queued)
            config = (queued / "config.pbtxt").read_text().replace('name: "add_sub"', f'name: "{model}"')
            assert "dynamic_batching {" in config
            (queued / "config.pbtxt").write_text(config.replace(
                "dynamic_batching {", "dynamic_batching {\n  default_queue_policy { max_queue_size: 8 }", 1))
        elif model == "countdown":
            write_countdown_model(root)
        elif model == "slow":
            write_slow_model(root, "slow", 0.5)
        else:
            shutil.copytree(MODEL_REPO / model, root / model)
    return root


@contextlib.asynccontextmanager
async def serving(repo: Path, transport: MemoryTransport, **service: Any) -> AsyncIterator[Serving]:
    settings = ServeSettings(model_repository=repo, service=ServiceSettings(**service))
    built = build_serving(settings, transport)
    async with built.running():
        yield built


async def watch(transport: MemoryTransport, model: str) -> None:
    """From now on, every request published for ``model`` is kept for ``published``."""
    await transport.fetch_first([channels.request_channel(model)], WATCH, "watcher", 1, 0)


async def published(transport: MemoryTransport, model: str) -> int:
    return len(await transport.fetch_first([channels.request_channel(model)], WATCH, "watcher", 10_000, 0))


def add_sub_request(seed: int, shape: tuple[int, ...] = (1, 16), **parameters: Any) -> tuple[ParsedInfer, np.ndarray]:
    a = np.random.default_rng(seed).random(shape, dtype=np.float32)
    body = {"inputs": [{"name": name, "shape": list(shape), "datatype": "FP32", "data": a.ravel().tolist()}
                       for name in ("INPUT0", "INPUT1")], "parameters": parameters}
    return parse_infer_request(json.dumps(body).encode(), None), a


def output(response: Response, name: str) -> np.ndarray:
    (tensor,) = [t for t in response.outputs if t.name == name]
    return decode_array(name, tensor.datatype, tensor.shape, tensor.data)


@pytest.mark.parametrize("direct, crossing", [(True, 0), (False, 8)])
async def test_a_plain_request_reaches_the_worker_without_the_broker_unless_told_otherwise(
        tmp_path: Path, direct: bool, crossing: int) -> None:
    transport = MemoryTransport()
    async with serving(repo_of(tmp_path, "add_sub"), transport, direct=direct) as built:
        await watch(transport, "add_sub")
        requests = [add_sub_request(seed) for seed in range(8)]
        responses = await asyncio.gather(*(built.front.service.infer("add_sub", "", parsed)
                                           for parsed, _ in requests))
        for (_, a), response in zip(requests, responses):
            assert response.error is None, response.error
            np.testing.assert_array_equal(output(response, "OUTPUT0"), a + a)
            np.testing.assert_array_equal(output(response, "OUTPUT1"), a - a)
        assert await published(transport, "add_sub") == crossing
        (row,) = (await built.front.statistics.model_stats("add_sub", ""))["model_stats"]
        assert row["inference_count"] == 8 and row["inference_stats"]["success"]["count"] == 8, row


async def test_what_needs_the_broker_still_crosses_it(tmp_path: Path) -> None:
    transport = MemoryTransport()
    async with serving(repo_of(tmp_path, "add_sub_queued", "countdown", "stateful_gru"), transport) as built:
        service = built.front.service
        for model in ("add_sub_queued", "countdown", "stateful_gru"):
            await watch(transport, model)
        # A model with a max_queue_size: its queue is the broker's.
        parsed, a = add_sub_request(1)
        response = await service.infer("add_sub_queued", "", parsed)
        np.testing.assert_array_equal(output(response, "OUTPUT0"), a + a)
        assert await published(transport, "add_sub_queued") == 1
        # A decoupled model's stream.
        countdown = parse_infer_request(json.dumps({"inputs": [
            {"name": "N", "shape": [1], "datatype": "INT32", "data": [3]}]}).encode(), None)
        replies = [r async for r in await service.stream("countdown", "", countdown)]
        assert len(replies) == 4 and replies[-1].final
        assert await published(transport, "countdown") == 1
        # A sequence's steps.
        for step, flags in enumerate(({"sequence_start": True}, {}, {"sequence_end": True})):
            features = [0.1 * step] * 16
            parsed = parse_infer_request(json.dumps({
                "inputs": [{"name": "FEATURES", "shape": [1, 1, 16], "datatype": "FP32", "data": features}],
                "parameters": {"sequence_id": 7, **flags}}).encode(), None)
            response = await service.infer("stateful_gru", "", parsed)
            assert response.error is None and output(response, "LOGITS").shape == (1, 8)
        assert await published(transport, "stateful_gru") == 3


async def test_a_request_the_model_refuses_is_answered_with_its_error_directly(tmp_path: Path) -> None:
    transport = MemoryTransport()
    async with serving(repo_of(tmp_path, "add_sub"), transport) as built:
        await watch(transport, "add_sub")
        parsed, _ = add_sub_request(2, shape=(1, 15))
        response = await built.front.service.infer("add_sub", "", parsed)
        assert response.error is not None and response.error.code == "invalid_argument"
        assert "INPUT0" in response.error.message
        good, a = add_sub_request(3)
        np.testing.assert_array_equal(output(await built.front.service.infer("add_sub", "", good), "OUTPUT0"), a + a)
        assert await published(transport, "add_sub") == 0


def slow_request(x: np.ndarray) -> ParsedInfer:
    return parse_infer_request(json.dumps({"inputs": [
        {"name": "X", "shape": [4], "datatype": "FP32", "data": x.tolist()}]}).encode(), None)


async def test_an_unload_waits_for_the_requests_handed_over_directly(tmp_path: Path) -> None:
    transport = MemoryTransport()
    async with serving(repo_of(tmp_path, "slow"), transport) as built:
        x = np.arange(4, dtype=np.float32)
        answers = [asyncio.create_task(built.front.service.infer("slow", "", slow_request(x))) for _ in range(2)]
        await asyncio.sleep(0.1)  # both handed over; the model computes the first
        assert await built.back.worker.unload_model("slow")
        for answer in answers:
            assert answer.done()
            np.testing.assert_array_equal(output(answer.result(), "Y"), x * 2)
        assert not built.back.worker.takes_directly("slow")


async def test_a_direct_request_still_times_out_as_one_through_the_broker_would(tmp_path: Path) -> None:
    transport = MemoryTransport()
    async with serving(repo_of(tmp_path, "slow"), transport, reply_timeout_s=0.2) as built:
        with pytest.raises(UpstreamTimeout, match="no reply for model 'slow' within 0.2 s"):
            await built.front.service.infer("slow", "", slow_request(np.zeros(4, dtype=np.float32)))


@pytest.mark.parametrize("flags, direct", [((), True), (("--direct",), True), (("--no-direct",), False)])
def test_the_command_line_flag_reaches_the_service_settings(flags: tuple[str, ...], direct: bool) -> None:
    args = build_parser().parse_args(["serve", "--model-repository", "model_repo", *flags])
    assert serve_settings(args).service.direct is direct
