"""A gateway's view of which models the fleet serves, from the workers' heartbeats."""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from broker.errors import TransportError
from gateway.periodic import Periodic
from workers.heartbeat import HeartbeatStore, ServedModels

log = structlog.get_logger("ferry.fleet")


class FleetReadiness:
    """The union of the models live workers serve, refreshed in the background.

    Calling it returns the last snapshot, so readiness checks in the request
    path never wait on the broker.
    """

    def __init__(self, store: HeartbeatStore, refresh_s: float = 0.5) -> None:
        self._store = store
        self._served: ServedModels = {}
        self._workers: tuple[str, ...] = ()
        self._refresher = Periodic(self.refresh, refresh_s, "fleet-readiness")

    def __call__(self) -> ServedModels:
        return self._served

    def workers(self) -> tuple[str, ...]:
        """The workers whose heartbeats were current at the last refresh."""
        return self._workers

    async def start(self) -> None:
        await self._refresher.start()

    async def aclose(self) -> None:
        await self._refresher.aclose()

    async def refresh(self) -> None:
        try:
            workers = await self._store.live()
        except TransportError as exc:
            # A broker we cannot reach serves nothing.
            log.warning("fleet.refresh_failed", error=str(exc))
            workers = {}
        self._served = union(workers.values())
        self._workers = tuple(sorted(workers))


def union(served: Iterable[ServedModels]) -> ServedModels:
    merged: dict[str, set[int]] = {}
    for models in served:
        for name, versions in models.items():
            merged.setdefault(name, set()).update(versions)
    return {name: tuple(sorted(versions)) for name, versions in merged.items()}
