"""The model versions one worker serves now, and how they are handed over.

``use`` picks the runner a request names (the newest for an unversioned
request) and counts it in flight until the request is answered. ``install``
swaps a model's runners at once, so new requests go to the new ones, and
returns what it replaced; ``retire`` closes those only after every request
they were computing has been answered (a drain per runner). So a new version
rolls out, and an old one leaves, without dropping a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType

import structlog

from workers.decimal_text import ascii_int
from workers.errors import ModelNotFound
from workers.repository.fingerprint import Fingerprint
from workers.repository.layout import ModelEntry
from workers.repository.overrides import Materialized
from workers.responder import Runner

log = structlog.get_logger("ferry.models")


@dataclass(slots=True)
class Served:
    """One model as loaded: its entry, a runner and a fingerprint per version,
    and the override directory it is served from (removed once retired)."""

    entry: ModelEntry
    runners: dict[int, Runner]
    prints: dict[int, Fingerprint] = field(default_factory=dict)
    owned: Materialized = Materialized(None, None)


@dataclass(frozen=True, slots=True)
class _Traits:
    stateful: bool  # a sequence model
    decoupled: bool
    retries_failures: bool


@dataclass(slots=True)
class Retired:
    runners: list[Runner]
    owned: Materialized | None = None


class ModelSet:
    def __init__(self) -> None:
        self._served: dict[str, Served] = {}
        self._in_flight: dict[Runner, int] = {}
        self._drained: dict[Runner, asyncio.Event] = {}  # set when a retired runner's last request is answered
        self._ready: Mapping[str, tuple[int, ...]] | None = None  # what ready() answers until install or remove
        self._traits: dict[str, _Traits] = {}  # per model, asked on every request, until install or remove

    def names(self) -> list[str]:
        return list(self._served)

    def get(self, model: str) -> Served | None:
        return self._served.get(model)

    def runners(self, model: str) -> Mapping[int, Runner]:
        served = self._served.get(model)
        return served.runners if served is not None else {}

    def stateful(self, model: str) -> bool:
        return self._traits_of(model).stateful

    def decoupled(self, model: str) -> bool:
        return self._traits_of(model).decoupled

    def cached(self, model: str) -> bool:
        """Whether its answers may be cached: ``response_cache`` on, and neither decoupled nor a sequence model."""
        served = self._served.get(model)
        if served is None:
            return False
        config = served.entry.config
        return config.response_cache.enable and not config.decoupled and config.sequence_batching is None

    def retries_failures(self, model: str) -> bool:
        return self._traits_of(model).retries_failures

    def _traits_of(self, model: str) -> _Traits:
        traits = self._traits.get(model)
        if traits is None:
            runners = self.runners(model).values()
            traits = _Traits(stateful=any(r.config.sequence_batching is not None for r in runners),
                             decoupled=any(r.config.decoupled for r in runners),
                             retries_failures=all(r.retries_failures for r in runners))
            if model in self._served:  # not kept for a model that is not served
                self._traits[model] = traits
        return traits

    def priority_levels(self, model: str) -> int:
        return max(runner.priority_levels for runner in self.runners(model).values())

    def ready(self) -> Mapping[str, tuple[int, ...]]:
        """The versions served, by model: asked on every request, built again only after a change."""
        if self._ready is None:
            self._ready = {name: tuple(sorted(served.runners)) for name, served in self._served.items()}
        return self._ready

    def use(self, model: str, version: str) -> AbstractContextManager[Runner]:
        """The runner for ``version`` ('' = the newest), counted in flight while the ``with`` block runs."""
        return _InUse(self, self._select(model, version))

    def _answered(self, runner: Runner) -> None:
        left = self._in_flight[runner] = self._in_flight[runner] - 1
        if left == 0 and runner in self._drained:
            self._drained[runner].set()

    def install(self, model: str, served: Served) -> Retired:
        """Serve ``served`` from now on; what it replaces is returned for ``retire``."""
        old = self._served.get(model)
        self._served[model] = served
        self._changed(model)
        if old is None:
            return Retired([])
        kept = set(served.runners.values())
        gone = [runner for runner in old.runners.values() if runner not in kept]
        same_dir = old.owned.owned_dir == served.owned.owned_dir
        return Retired(gone, None if same_dir else old.owned)

    def remove(self, model: str) -> Retired:
        old = self._served.pop(model, None)
        self._changed(model)
        return Retired([]) if old is None else Retired(list(old.runners.values()), old.owned)

    def _changed(self, model: str) -> None:
        """Forget what was kept of the served models (``ready``) and of ``model`` itself."""
        self._ready = None
        self._traits.pop(model, None)

    async def retire(self, retired: Retired) -> None:
        """Close each runner once nothing it computes is still in flight."""
        for runner in retired.runners:
            if self._in_flight.get(runner, 0) > 0:
                log.info("model.draining", model=runner.entry.name, version=runner.version,
                         in_flight=self._in_flight[runner])
                # Retired: no new request reaches it, so once none is in flight none will be.
                await self._drained.setdefault(runner, asyncio.Event()).wait()
            self._in_flight.pop(runner, None)
            self._drained.pop(runner, None)
            await runner.aclose()
            log.info("model.unloaded", model=runner.entry.name, version=runner.version)
        if retired.owned is not None:
            retired.owned.remove()

    async def aclose(self) -> None:
        for model in list(self._served):
            await self.retire(self.remove(model))

    def _select(self, model: str, version: str) -> Runner:
        versions = self.runners(model)
        if not versions:
            raise ModelNotFound(f"model '{model}' is not loaded")
        if not version:
            return versions[max(versions)]
        number = ascii_int(version)
        runner = None if number is None else versions.get(number)
        if runner is None:
            raise ModelNotFound(f"model '{model}' has no version '{version}' loaded")
        return runner


class _InUse:
    """``ModelSet.use``'s context: a class, not a generator, since every request enters one."""

    __slots__ = ("_models", "_runner")

    def __init__(self, models: ModelSet, runner: Runner) -> None:
        self._models = models
        self._runner = runner

    def __enter__(self) -> Runner:
        in_flight = self._models._in_flight
        in_flight[self._runner] = in_flight.get(self._runner, 0) + 1
        return self._runner

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._models._answered(self._runner)
