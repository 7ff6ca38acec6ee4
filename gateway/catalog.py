"""What the gateway knows about models: their configs, and which are ready.

Configs come from the model repository the gateway is pointed at (or from a
load request's overrides, once loaded); readiness comes from whoever serves
the models (in one process, the local worker). ``expected`` is what the
server must serve to be ready: every model, or in explicit model control
mode the ones loaded so far.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from gateway.errors import InvalidRequest
from workers.decimal_text import ascii_int
from workers.errors import ConfigError, ModelNotFound
from workers.repository.layout import ModelEntry, ModelRepository, RepositoryIndex, is_safe_name

ReadyVersions = Callable[[], Mapping[str, tuple[int, ...]]]


class ModelCatalog:
    def __init__(self, repository: ModelRepository, ready: ReadyVersions,
                 expected: Iterable[str] | None = None) -> None:
        self._repository = repository
        self._ready = ready
        self._index: RepositoryIndex = repository.scan()
        self._expected = None if expected is None else set(expected)
        self._unloaded: set[str] = set()

    @property
    def index(self) -> RepositoryIndex:
        return self._index

    @property
    def repository(self) -> ModelRepository:
        return self._repository

    def refresh(self) -> None:
        self._index = self._repository.scan()

    def install(self, name: str, entry: ModelEntry) -> None:
        """``name`` is loaded as ``entry`` (read afresh, perhaps with overrides)."""
        errors = {k: v for k, v in self._index.errors.items() if k != name}
        self._index = RepositoryIndex(MappingProxyType({**self._index.entries, name: entry}),
                                      MappingProxyType(errors))
        self._unloaded.discard(name)
        if self._expected is not None:
            self._expected.add(name)

    def unloaded(self, name: str) -> None:
        self._unloaded.add(name)
        if self._expected is not None:
            self._expected.discard(name)

    def names(self) -> list[str]:
        return sorted({*self._index.entries, *self._index.errors})

    def entry(self, name: str) -> ModelEntry:
        entry = self._index.entries.get(name)
        if entry is not None:
            return entry
        error = self._index.errors.get(name)
        # Triton's words: clients match on the start of "Request for unknown model".
        if isinstance(error, ConfigError):
            raise ModelNotFound(f"Request for unknown model: '{name}' has no available versions: {error}")
        raise ModelNotFound(f"Request for unknown model: '{name}' is not found")

    def version(self, name: str, version: str) -> tuple[ModelEntry, int | None]:
        """The entry and the version a request names ('' = the latest ready)."""
        entry = self.entry(name)
        if not version:
            return entry, None
        number = ascii_int(version)
        if number is None or number not in entry.versions:
            raise ModelNotFound(f"Request for unknown model: '{name}' version {version} is not found")
        return entry, number

    def ready_versions(self, name: str) -> tuple[int, ...]:
        return self._ready().get(name, ())

    def is_ready(self, name: str, version: int | None = None) -> bool:
        ready = self.ready_versions(name)
        return bool(ready) if version is None else version in ready

    def all_ready(self) -> bool:
        served = self._ready()
        expected = self._index.entries if self._expected is None else self._expected
        return all(served.get(name) for name in expected)

    def states(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Rows for the repository index: name, version, state, reason."""
        rows: list[dict[str, str]] = []
        for name in self.names():
            entry = self._index.entries.get(name)
            if entry is None:
                rows.append({"name": name, "state": "UNAVAILABLE", "reason": str(self._index.errors[name])})
                continue
            ready = self.ready_versions(name)
            for version in sorted({*entry.versions, *ready}):
                if version in ready:
                    rows.append({"name": name, "version": str(version), "state": "READY", "reason": ""})
                else:
                    rows.append({"name": name, "version": str(version), "state": "UNAVAILABLE",
                                 "reason": self._reason(name)})
        return [row for row in rows if row["state"] == "READY"] if ready_only else rows

    def _reason(self, name: str) -> str:
        if name in self._unloaded:
            return "unloaded"
        if self._expected is not None and name not in self._expected:
            return f"not loaded (explicit model control: POST /v2/repository/models/{name}/load)"
        return "not served by any live worker"


def checked_target(name: str, version: str) -> tuple[str, str]:
    """A model name and version as a request gives them, refused when they could leave the repository."""
    for text, what in ((name, "model name"), (version, "model version")):
        if text and not is_safe_name(text):
            raise InvalidRequest(f"invalid {what} '{text}': it must not start with '.' "
                                 "or contain '..', '/', '\\' or NUL")
    return name, version
