"""What the gateway knows about models: their configs, and which are ready.

Configs come from the model repository the gateway is pointed at; readiness
comes from whoever serves the models (in one process, the local worker).
"""

from __future__ import annotations

from collections.abc import Callable

from workers.errors import ConfigError, ModelNotFound
from workers.repository import ModelEntry, ModelRepository, RepositoryIndex

ReadyVersions = Callable[[], dict[str, tuple[int, ...]]]


class ModelCatalog:
    def __init__(self, repository: ModelRepository, ready: ReadyVersions) -> None:
        self._repository = repository
        self._ready = ready
        self._index: RepositoryIndex = repository.scan()

    @property
    def index(self) -> RepositoryIndex:
        return self._index

    def refresh(self) -> None:
        self._index = self._repository.scan()

    def names(self) -> list[str]:
        return sorted({*self._index.entries, *self._index.errors})

    def entry(self, name: str) -> ModelEntry:
        entry = self._index.entries.get(name)
        if entry is not None:
            return entry
        error = self._index.errors.get(name)
        if isinstance(error, ConfigError):
            raise ModelNotFound(f"model '{name}' is unavailable: {error}")
        raise ModelNotFound(f"unknown model '{name}'")

    def version(self, name: str, version: str) -> tuple[ModelEntry, int | None]:
        """The entry and the version a request names ('' = the latest ready)."""
        entry = self.entry(name)
        if not version:
            return entry, None
        if not version.isdigit() or int(version) not in entry.versions:
            raise ModelNotFound(f"model '{name}' has no version '{version}'")
        return entry, int(version)

    def ready_versions(self, name: str) -> tuple[int, ...]:
        return self._ready().get(name, ())

    def is_ready(self, name: str, version: int | None = None) -> bool:
        ready = self.ready_versions(name)
        return bool(ready) if version is None else version in ready

    def all_ready(self) -> bool:
        served = self._ready()
        return all(served.get(name) for name in self._index.entries)

    def states(self) -> list[dict[str, str]]:
        """Rows for the repository index: name, version, state, reason."""
        rows: list[dict[str, str]] = []
        for name in self.names():
            entry = self._index.entries.get(name)
            if entry is None:
                rows.append({"name": name, "state": "UNAVAILABLE", "reason": str(self._index.errors[name])})
                continue
            ready = self.ready_versions(name)
            for version in entry.versions:
                state = "READY" if version in ready else "UNAVAILABLE"
                rows.append({"name": name, "version": str(version), "state": state})
        return rows
