"""Poll mode: every ``interval_s``, serve what the repository now holds.

A model directory whose files changed (a new or removed version directory, a
rewritten ``config.pbtxt`` or model file) is reloaded; a new one is loaded;
one that disappeared is unloaded. A model that fails to reload keeps serving
what it served (as Triton does).
"""

from __future__ import annotations

import asyncio

import structlog

from workers.control.listener import ManagedModels
from workers.repository.fingerprint import Fingerprint, fingerprint
from workers.repository.layout import ModelRepository, is_safe_name

log = structlog.get_logger("ferry.poll")


class RepositoryPoller:
    def __init__(self, repository: ModelRepository, models: ManagedModels, interval_s: float) -> None:
        self._repository = repository
        self._models = models
        self._interval_s = interval_s
        self._seen: dict[str, Fingerprint] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._seen = self._snapshot()
        self._task = asyncio.create_task(self._loop(), name="repository-poll")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def poll(self) -> None:
        now = self._snapshot()
        for name in sorted(now.keys() | self._seen.keys()):
            if now.get(name) == self._seen.get(name) or not self._models.serves(name):
                continue
            try:
                if name in now:
                    versions = await self._models.load_model(name)
                    log.info("poll.loaded", model=name, versions=versions)
                else:
                    await self._models.unload_model(name)
                    log.info("poll.unloaded", model=name)
            except Exception as exc:
                log.error("poll.load_failed", model=name, error=str(exc))
        self._seen = now

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.poll()

    def _snapshot(self) -> dict[str, Fingerprint]:
        try:
            children = sorted(self._repository.root.iterdir())
        except OSError as exc:
            log.warning("poll.list_failed", root=str(self._repository.root), error=str(exc))
            return dict(self._seen)
        return {child.name: fingerprint(child) for child in children
                if is_safe_name(child.name) and child.is_dir() and not child.is_symlink()}
