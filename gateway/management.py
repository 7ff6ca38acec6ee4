"""Model management: the repository index, and loading and unloading models
across the fleet (Triton's model repository extension).

``ModelManager.load`` checks the request where it arrives (the name, the
control mode, every override, the config they make), then tells every live
worker through the control channel and returns once the workers answered and
their heartbeats show the model's versions ready. A worker's load error fails
the request with that error. In ``none`` and ``poll`` mode load and unload
are refused, as Triton refuses them; in ``poll`` mode the catalog is
re-scanned every ``poll_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from gateway.catalog import ModelCatalog
from workers.control.client import ControlClient, Gathered
from gateway.errors import InvalidRequest, ModelUnavailable, UpstreamTimeout
from workers.control.messages import Action, ControlSettings
from workers.errors import ConfigError, ModelNotFound
from workers.repository.overrides import (
    LoadOverrides, Materialized, materialize, parse_load_parameters, parse_unload_parameters,
)
from workers.repository.layout import is_safe_name

log = structlog.get_logger("ferry.gateway.management")

READY_POLL_S = 0.05


class ControlRefused(InvalidRequest):
    """Load and unload are not allowed in this model control mode."""


class LoadFailed(InvalidRequest):
    """A worker could not load (or unload) the model."""


@dataclass(frozen=True, slots=True)
class ManagementSettings:
    control: ControlSettings = ControlSettings()
    load_timeout_s: float = 120.0


class ModelManager:
    def __init__(self, catalog: ModelCatalog, control: ControlClient | None,
                 settings: ManagementSettings = ManagementSettings(),
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._catalog = catalog
        self._control = control
        self._settings = settings
        self._monotonic = monotonic
        self._owned: dict[str, Materialized] = {}
        self._lock = asyncio.Lock()
        self._poller: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._control is not None:
            await self._control.start()
        if self._settings.control.mode == "poll":
            self._poller = asyncio.create_task(self._poll(), name="catalog-poll")

    async def aclose(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if self._control is not None:
            await self._control.aclose()
        for owned in self._owned.values():
            owned.remove()
        self._owned.clear()

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return self._catalog.states(ready_only)

    async def load(self, name: str, parameters: Any) -> None:
        """Triton's load: ``parameters`` is the request's, overrides and all."""
        self._allowed("load", name)
        await self.load_with(name, parse_load_parameters(name, parameters))

    async def load_with(self, name: str, overrides: LoadOverrides) -> None:
        """A load whose overrides are already built (a platform's model archive)."""
        control = self._allowed("load", name)
        async with self._lock:
            entry, owned = self._resolve(name, overrides)
            try:
                gathered = await self._send(control, "load", name, overrides)
                versions = _outcome(gathered, "load", name)
            except BaseException:
                owned.remove()
                raise
            self._keep(name, owned)
            self._catalog.install(name, entry)
            await self._until(lambda: set(versions) <= set(self._catalog.ready_versions(name)),
                              f"model '{name}' versions {sorted(versions)} to be ready")
        log.info("model.load_done", model=name, versions=sorted(versions))

    async def unload(self, name: str, parameters: Any) -> None:
        control = self._allowed("unload", name)
        parse_unload_parameters(parameters)
        if name not in self._catalog.names():
            raise LoadFailed(f"failed to unload '{name}': no such model in the repository")
        async with self._lock:
            gathered = await self._send(control, "unload", name, LoadOverrides())
            _outcome(gathered, "unload", name)
            self._catalog.unloaded(name)
            await self._until(lambda: not self._catalog.ready_versions(name), f"model '{name}' to be unloaded")
        log.info("model.unload_done", model=name)

    def _allowed(self, action: str, name: str) -> ControlClient:
        mode = self._settings.control.mode
        if not self._settings.control.accepts_requests or self._control is None:
            raise ControlRefused(f"explicit model {action} is not allowed: the model control mode is '{mode}' "
                                 "(start ferry with --model-control-mode=explicit)")
        if not is_safe_name(name):
            raise InvalidRequest(f"invalid model name {name!r}: it must not start with '.' or contain "
                                 "'..', '/', '\\' or NUL")
        return self._control

    def _resolve(self, name: str, overrides: LoadOverrides) -> tuple[Any, Materialized]:
        """The entry the load makes, read here first so a bad name or config is a 400 before any worker acts."""
        owned = materialize(name, overrides)
        try:
            return self._catalog.repository.entry(name, overrides.config, owned.model_dir), owned
        except ModelNotFound as exc:
            owned.remove()
            raise LoadFailed(f"failed to load '{name}', {exc}") from None
        except ConfigError as exc:
            owned.remove()
            raise LoadFailed(f"failed to load '{name}', {exc}") from None
        except BaseException:
            owned.remove()
            raise

    async def _send(self, control: ControlClient, action: Action, name: str, overrides: LoadOverrides) -> Gathered:
        workers = await control.live_workers()
        if not workers:
            raise ModelUnavailable(f"cannot {action} model '{name}': no worker is live")
        return await control.send(action, name, overrides, self._settings.load_timeout_s, workers)

    def _keep(self, name: str, owned: Materialized) -> None:
        old = self._owned.pop(name, None)
        if old is not None:
            old.remove()
        if owned.owned_dir is not None:
            self._owned[name] = owned

    async def _until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = self._monotonic() + self._settings.load_timeout_s
        while not condition():
            if self._monotonic() >= deadline:
                raise UpstreamTimeout(f"timed out after {self._settings.load_timeout_s:g} s waiting for {what}")
            await asyncio.sleep(READY_POLL_S)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._settings.control.poll_s)
            try:
                self._catalog.refresh()
            except ConfigError as exc:
                log.warning("catalog.poll_failed", error=str(exc))


def _outcome(gathered: Gathered, action: str, name: str) -> tuple[int, ...]:
    """The versions loaded; the first worker's error, or why nothing was done."""
    failed = [r for r in gathered.replies.values() if r.outcome == "failed"]
    if failed:
        raise LoadFailed(f"failed to {action} '{name}', on worker {failed[0].worker}: {failed[0].error}")
    done = [r for r in gathered.replies.values() if r.outcome in ("loaded", "unloaded")]
    if not done:
        if gathered.missing:
            raise UpstreamTimeout(f"no worker answered the {action} of model '{name}' in time "
                                  f"(waiting for {sorted(gathered.missing)})")
        raise ModelUnavailable(f"no live worker serves model '{name}' (each was started with --models)")
    if gathered.missing:
        log.warning("control.partial", action=action, model=name, missing=sorted(gathered.missing))
    return tuple(sorted({v for reply in done for v in reply.versions}))
