"""Turning a model's name, and a load request's overrides, into started runners.

``build`` reads the model afresh (from the repository, or from the override
directory it writes), starts a runner per version the version policy selects
and runs each one's warmup. A version whose directory and config are unchanged
keeps the runner already serving it. If any version fails, every runner it
started is closed again and the error names the version: what was serving
keeps serving.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from workers.errors import ModelLoadError, WorkerError
from workers.model_set import Served
from workers.repository.fingerprint import fingerprint
from workers.repository.layout import ModelEntry, ModelRepository
from workers.repository.overrides import LoadOverrides, Materialized, materialize
from workers.responder import Runner
from workers.warmup import warm_up

log = structlog.get_logger("ferry.loader")

RunnerFactory = Callable[[ModelEntry, int], Runner]


class ModelLoader:
    def __init__(self, repository: ModelRepository, new_runner: RunnerFactory) -> None:
        self._repository = repository
        self._new_runner = new_runner

    def resolve(self, name: str, overrides: LoadOverrides = LoadOverrides()) -> tuple[ModelEntry, Materialized]:
        """The model's entry, and the directory written for its override files."""
        owned = materialize(name, overrides)
        try:
            return self._repository.entry(name, overrides.config, owned.model_dir), owned
        except BaseException:
            owned.remove()
            raise

    async def build(self, name: str, overrides: LoadOverrides = LoadOverrides(),
                    current: Served | None = None) -> Served:
        entry, owned = self.resolve(name, overrides)
        served = Served(entry, {}, {}, owned)
        started: list[Runner] = []
        try:
            for version in entry.versions:
                await self._version(served, version, current, started)
        except BaseException:
            for runner in started:
                await runner.aclose()
            owned.remove()
            raise
        return served

    async def _version(self, served: Served, version: int, current: Served | None,
                       started: list[Runner]) -> None:
        entry = served.entry
        served.prints[version] = fingerprint(entry.path / str(version))
        if current is not None and _unchanged(current, entry, version, served.prints[version]):
            served.runners[version] = current.runners[version]
            return
        runner = self._new_runner(entry, version)
        started.append(runner)
        try:
            await runner.start()
            await warm_up(runner)
        except WorkerError as exc:
            raise ModelLoadError(f"failed to load '{entry.name}', version {version}: {exc}") from exc
        except Exception as exc:
            raise ModelLoadError(f"failed to load '{entry.name}', version {version}: "
                                 f"{type(exc).__name__}: {exc}") from exc
        served.runners[version] = runner
        log.info("model.loaded", model=entry.name, version=version, path=str(entry.path))


def _unchanged(current: Served, entry: ModelEntry, version: int, printed: object) -> bool:
    return (version in current.runners and current.entry.path == entry.path
            and current.entry.config == entry.config and current.prints.get(version) == printed)
