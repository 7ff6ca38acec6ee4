"""ModelSet: which versions are served, and a retired runner closed only once its requests are answered."""

from __future__ import annotations

import asyncio
from pathlib import Path

from workers.model_set import ModelSet, Served
from workers.repository.layout import ModelRepository

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"


class Runner:
    retries_failures = True

    def __init__(self, version: int) -> None:
        self.version = version
        self.entry = ModelRepository(MODEL_REPO).entry("add_sub")
        self.config = self.entry.config
        self.closed = False

    async def aclose(self) -> None:
        self.closed = True


def served(*runners: Runner) -> Served:
    return Served(runners[0].entry, {runner.version: runner for runner in runners})  # type: ignore[misc]


async def test_ready_follows_every_install_and_removal():
    models = ModelSet()
    assert models.ready() == {}
    models.install("add_sub", served(Runner(1)))
    assert models.ready() == {"add_sub": (1,)}
    assert models.ready() is models.ready(), "built again without a change"
    models.install("add_sub", served(Runner(3), Runner(2)))
    assert models.ready() == {"add_sub": (2, 3)}
    models.install("other", served(Runner(1)))
    assert models.ready() == {"add_sub": (2, 3), "other": (1,)}
    models.remove("add_sub")
    assert models.ready() == {"other": (1,)}


async def test_a_retired_runner_is_closed_only_after_its_last_request_is_answered():
    models = ModelSet()
    old = Runner(1)
    models.install("add_sub", served(old))
    answered = asyncio.Event()

    async def request() -> None:
        with models.use("add_sub", "") as runner:
            assert runner is old
            await answered.wait()

    in_flight = asyncio.create_task(request())
    await asyncio.sleep(0)
    retiring = asyncio.create_task(models.retire(models.install("add_sub", served(Runner(2)))))
    await asyncio.sleep(0.05)
    assert not old.closed, "closed while a request was in flight"
    answered.set()
    await asyncio.wait_for(asyncio.gather(in_flight, retiring), 5)
    assert old.closed


async def test_what_a_model_is_follows_every_install_and_removal():
    models = ModelSet()
    plain = Runner(1)
    assert (models.stateful("add_sub"), models.decoupled("add_sub")) == (False, False)
    models.install("add_sub", served(plain))
    assert (models.stateful("add_sub"), models.decoupled("add_sub"), models.retries_failures("add_sub")) \
        == (False, False, True)
    streaming = Runner(2)
    policy = plain.config.model_transaction_policy.model_copy(update={"decoupled": True})
    streaming.config = plain.config.model_copy(update={"model_transaction_policy": policy})
    models.install("add_sub", served(plain, streaming))
    assert models.decoupled("add_sub"), "the model's new runners were not asked"
    models.remove("add_sub")
    assert not models.decoupled("add_sub")
