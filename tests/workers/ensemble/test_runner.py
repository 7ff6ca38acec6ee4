"""Ensembles run by a real worker on the in-memory transport: each step is a
request on its model's channel, answered on the worker's own reply channel."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from broker import channels
from broker.envelope import Request, Response, WireTensor, decode_request, encode_request
from broker.replies import ReplyRouter
from broker.transports.memory import MemoryTransport
from workers.ensemble.broker_caller import owner_id
from workers.repository.layout import ModelRepository
from workers.worker import Worker, WorkerSettings

UNARY = '''
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ }}
'''
SUM = '''
name: "sum"
backend: "python"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "S" data_type: TYPE_FP32 dims: [ 4 ] } ]
'''
SOURCES = {
    "double": "class Model:\n    def infer(self, inputs):\n        return {'Y': inputs['X'] * 2}\n",
    "add_one": "class Model:\n    def infer(self, inputs):\n        return {'Y': inputs['X'] + 1}\n",
    "positive": ("class Model:\n    def infer(self, inputs):\n        if (inputs['X'] < 0).any():\n"
                 "            raise ValueError('X must not be negative')\n        return {'Y': inputs['X']}\n"),
    "sum": "class Model:\n    def infer(self, inputs):\n        return {'S': inputs['A'] + inputs['B']}\n",
}
# Two models that each wait for the other to be computing too: an ensemble that
# ran its independent steps one after the other would fail them on the timeout.
# They meet through files, since each may run in an instance process of its own.
RENDEZVOUS = '''import os, time

DIR, ME, OTHER = %(dir)r, %(me)r, %(other)r


class Model:
    calls = 0

    def infer(self, inputs):
        Model.calls += 1
        open(os.path.join(DIR, f"{ME}.{Model.calls}"), "w").close()
        deadline = time.monotonic() + 10
        while not os.path.exists(os.path.join(DIR, f"{OTHER}.{Model.calls}")):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{OTHER} never computed beside {ME}")
            time.sleep(0.005)
        return {'Y': inputs['X'] * %(factor)s}
'''
ENSEMBLE_HEAD = '''
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
'''
ENSEMBLES = {
    # IN -> double -> add_one -> positive -> OUT
    "chain": '''
      { model_name: "double" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "doubled" } },
      { model_name: "positive" input_map { key: "X" value: "plus_one" } output_map { key: "Y" value: "OUT" } },
      { model_name: "add_one" model_version: 1 input_map { key: "X" value: "doubled" } output_map { key: "Y" value: "plus_one" } }
    ''',
    # IN -> (left x2, right x3) at once -> sum -> OUT
    "diamond": '''
      { model_name: "left" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "l" } },
      { model_name: "right" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "r" } },
      { model_name: "sum" input_map { key: "A" value: "l" } input_map { key: "B" value: "r" } output_map { key: "S" value: "OUT" } }
    ''',
}


def write(repo: Path, name: str, config: str, source: str | None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    if source is not None:
        (repo / name / "1" / "model.py").write_text(source)


@pytest.fixture
def repository(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    for name, source in SOURCES.items():
        write(tmp_path, name, SUM if name == "sum" else UNARY.format(name=name), source)
    meeting = tmp_path_factory.mktemp("rendezvous")  # not in the repository, where it would be a model
    for me, other, factor in (("left", "right", 2), ("right", "left", 3)):
        write(tmp_path, me, UNARY.format(name=me), RENDEZVOUS % {"dir": str(meeting), "me": me, "other": other,
                                                                 "factor": factor})
    for name, steps in ENSEMBLES.items():
        write(tmp_path, name, ENSEMBLE_HEAD.format(name=name) + f"ensemble_scheduling {{ step [ {steps} ] }}", None)
    return tmp_path


class Client:
    def __init__(self, transport: MemoryTransport, router: ReplyRouter) -> None:
        self.transport = transport
        self.router = router

    async def infer(self, model: str, values: np.ndarray, outputs: tuple[str, ...] = ()) -> Response:
        request = Request(id=uuid.uuid4().hex, model=model, reply_to=self.router.channel, outputs=outputs,
                          inputs=(WireTensor("IN", "FP32", values.shape, values.astype(np.float32).tobytes()),))
        future = self.router.expect(request.id)
        await self.transport.publish(channels.request_channel(model), encode_request(request))
        async with asyncio.timeout(20):
            return await future


@pytest.fixture
async def client(repository: Path) -> AsyncIterator[Client]:
    transport = MemoryTransport()
    worker = Worker(transport, ModelRepository(repository), WorkerSettings(worker_id="w1", poll_timeout_s=0.05))
    router = ReplyRouter(transport, "test-client", poll_timeout_s=0.05)
    await router.start()
    await worker.start()
    try:
        yield Client(transport, router)
    finally:
        await worker.aclose()
        await router.aclose()
        await transport.aclose()


def output(response: Response, name: str = "OUT") -> np.ndarray:
    (tensor,) = [t for t in response.outputs if t.name == name]
    assert tensor.datatype == "FP32"
    return np.frombuffer(tensor.data, np.float32).reshape(tensor.shape)


async def test_a_chain_runs_its_steps_in_dependency_order_not_config_order(client: Client):
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    response = await client.infer("chain", values)
    assert response.error is None, response.error
    np.testing.assert_array_equal(output(response), values * 2 + 1)
    assert response.model == "chain" and response.model_version == "1"
    assert [t.name for t in response.outputs] == ["OUT"]


async def test_the_response_reports_each_steps_latency(client: Client):
    response = await client.infer("chain", np.ones((1, 4), np.float32))
    keys = {k for k in response.parameters if k.startswith("ensemble_")}
    assert keys == {"ensemble_step_ms.double", "ensemble_step_ms.add_one", "ensemble_step_ms.positive", "ensemble_ms"}
    steps = [response.parameters[k] for k in keys - {"ensemble_ms"}]
    assert all(isinstance(ms, float) and ms > 0 for ms in steps)
    # Steps of a chain run one after another, so the whole is at least their sum.
    assert response.parameters["ensemble_ms"] >= sum(steps) * 0.99  # type: ignore[operator]


async def test_independent_steps_run_concurrently(client: Client):
    values = np.arange(4, dtype=np.float32).reshape(1, 4)
    response = await client.infer("diamond", values)
    assert response.error is None, response.error.message  # a broken barrier would fail a step
    np.testing.assert_array_equal(output(response), values * 5)
    for _ in range(3):
        again = await client.infer("diamond", values)
        assert again.error is None, again.error.message


async def test_a_failing_step_is_named_and_keeps_its_error_code(client: Client):
    response = await client.infer("chain", np.full((1, 4), -3, np.float32))
    assert response.error is not None
    assert response.error.code == "invalid_argument"
    assert response.error.message.startswith("ensemble 'chain' step 2 (model 'positive'): ")
    assert "X must not be negative" in response.error.message
    # The worker is unharmed: the next request succeeds.
    ok = await client.infer("chain", np.ones((1, 4), np.float32))
    assert ok.error is None


async def test_a_bad_input_is_refused_by_the_ensemble_before_any_step(client: Client):
    response = await client.infer("chain", np.ones((1, 5), np.float32))
    assert response.error is not None and response.error.code == "invalid_argument"
    assert "input 'IN'" in response.error.message and "step" not in response.error.message
    missing = await client.infer("chain", np.ones((1, 4), np.float32), outputs=("NOPE",))
    assert missing.error is not None and "no output 'NOPE'" in missing.error.message


async def test_steps_travel_on_their_models_channels_and_reply_to_the_workers_channel(client: Client):
    channel = channels.request_channel("add_one")
    # A second group on the step's channel sees every step request published there.
    await client.transport.fetch(channel, "observer", "o", 1, 0)
    await client.infer("chain", np.ones((1, 4), np.float32))
    seen = await client.transport.fetch(channel, "observer", "o", 10, 1)
    assert len(seen) == 1
    step = decode_request(seen[0].payload)
    assert step.model == "add_one" and step.model_version == "1"
    assert step.reply_to == channels.reply_channel(owner_id("w1"))
    assert [t.name for t in step.inputs] == ["X"]


async def test_a_step_nobody_serves_fails_at_the_requests_deadline_naming_the_step(repository: Path):
    transport = MemoryTransport()
    # This worker serves the ensemble and two of its steps, not add_one.
    worker = Worker(transport, ModelRepository(repository),
                    WorkerSettings(worker_id="w2", models=("chain", "double", "positive"), poll_timeout_s=0.05))
    router = ReplyRouter(transport, "test-client", poll_timeout_s=0.05)
    await router.start()
    await worker.start()
    try:
        values = np.ones((1, 4), np.float32)
        request = Request(id="late", model="chain", reply_to=router.channel, timeout_us=300_000,
                          deadline_ns=time.time_ns() + 300_000_000,
                          inputs=(WireTensor("IN", "FP32", values.shape, values.tobytes()),))
        future = router.expect(request.id)
        await transport.publish(channels.request_channel("chain"), encode_request(request))
        async with asyncio.timeout(10):
            response = await future
        assert response.error is not None and response.error.code == "timeout"
        assert response.error.message.startswith("ensemble 'chain' step 3 (model 'add_one'): no reply")
    finally:
        await worker.aclose()
        await router.aclose()
        await transport.aclose()
