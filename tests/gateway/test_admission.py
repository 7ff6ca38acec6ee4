"""Admission against the model's queue depth on a real (in-memory) broker."""

from __future__ import annotations

import pytest

from broker import channels
from broker.transports.memory import MemoryTransport
from gateway.admission import QueueLimits
from gateway.errors import QueueFull
from workers.repository.config import ModelConfig


def config(max_queue_size: int, levels: int = 0) -> ModelConfig:
    batching: dict[str, object] = {"default_queue_policy": {"max_queue_size": max_queue_size}}
    if levels:
        batching |= {"priority_levels": levels, "default_priority_level": levels}
    return ModelConfig.model_validate({
        "name": "m", "backend": "python", "max_batch_size": 4, "dynamic_batching": batching,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
    })


async def admit(limits: QueueLimits, model: str, cfg: ModelConfig) -> None:
    async with limits.admission(model, cfg):
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_requests_are_refused_once_the_queue_holds_max_queue_size():
    clock = Clock()
    async with MemoryTransport() as broker:
        limits = QueueLimits(broker, clock=clock, retry_after_s=2)
        for _ in range(3):
            await broker.publish(channels.request_channel("m"), b"waiting")
        await admit(limits, "m", config(5))
        await admit(limits, "m", config(5))  # 3 waiting + 2 admitted since the sample
        with pytest.raises(QueueFull, match="queue of model 'm' is full") as refused:
            await admit(limits, "m", config(5))
        assert refused.value.retry_after_s == 2
        # Workers take and answer everything; the next sample sees room again.
        for delivery in await broker.fetch(channels.request_channel("m"), channels.worker_group("m"), "w", 10, 0):
            await broker.ack(delivery)
        clock.now += 1
        await admit(limits, "m", config(5))


async def test_held_but_unanswered_requests_count_and_every_level_counts():
    clock = Clock()
    async with MemoryTransport() as broker:
        limits = QueueLimits(broker, clock=clock)
        group = channels.worker_group("m")
        await broker.publish(channels.request_channel("m", level=1), b"a")
        await broker.publish(channels.request_channel("m", level=2), b"b")
        await broker.fetch(channels.request_channel("m", level=1), group, "w", 1, 0)  # held, not acked
        with pytest.raises(QueueFull):
            await admit(limits, "m", config(2, levels=2))


async def test_a_model_without_a_limit_is_never_refused():
    async with MemoryTransport() as broker:
        limits = QueueLimits(broker)
        for _ in range(100):
            await broker.publish(channels.request_channel("m"), b"x")
        await admit(limits, "m", config(0))


async def test_requests_admitted_but_not_yet_published_still_count_after_a_sample():
    clock = Clock()
    async with MemoryTransport() as broker:
        limits = QueueLimits(broker, clock=clock)
        async with limits.admission("m", config(2)):
            clock.now += 1  # a fresh sample now cannot see the request still being published
            await admit(limits, "m", config(2))
            with pytest.raises(QueueFull):
                await admit(limits, "m", config(2))
