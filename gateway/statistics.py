"""Triton's statistics extension: ``GET /v2/models[/{m}[/versions/{v}]]/stats``.

The numbers are the live workers' own (``workers.telemetry.triton_stats``), as
their last heartbeats carry them, added up over the fleet; in ``ferry serve``
the one worker is asked directly. So they lag the last request by up to a
heartbeat interval on a fleet, and a worker that has stopped no longer counts.

A model is listed with each version the repository has or a worker reports,
zeros included, as Triton lists a ready model that has served nothing yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.catalog import ModelCatalog
from gateway.dashboard_sampler import WorkerBeats
from workers.errors import ModelNotFound
from workers.telemetry.triton_stats import DURATIONS, valid_wire

class _Sums:
    """One model version's numbers, added up over the workers."""

    def __init__(self) -> None:
        self.durations = {name: [0, 0] for name in DURATIONS}
        self.batches: dict[int, list[int]] = {}
        self.last_ms = 0
        self.inferences = 0
        self.executions = 0

    def add(self, stats: Mapping[str, Any]) -> None:
        self.inferences += stats["inferences"]
        self.executions += stats["executions"]
        triton = stats.get("triton")
        if triton is None or not valid_wire(triton):
            return
        for name, (count, ns) in triton["durations"].items():
            self.durations[name][0] += count
            self.durations[name][1] += ns
        for size, *row in triton["batches"]:
            summed = self.batches.setdefault(size, [0, 0, 0, 0])
            for index, value in enumerate(row):
                summed[index] += value
        self.last_ms = max(self.last_ms, triton["last_ms"])

    def render(self, name: str, version: str) -> dict[str, Any]:
        inference = {key: {"count": count, "ns": ns} for key, (count, ns) in self.durations.items()}
        batches = [{"batch_size": size,
                    "compute_input": {"count": count, "ns": input_ns},
                    "compute_infer": {"count": count, "ns": infer_ns},
                    "compute_output": {"count": count, "ns": output_ns}}
                   for size, (count, input_ns, infer_ns, output_ns) in sorted(self.batches.items())]
        return {"name": name, "version": version, "last_inference": self.last_ms,
                "inference_count": self.inferences, "execution_count": self.executions,
                "inference_stats": inference, "response_stats": {}, "batch_stats": batches, "memory_usage": []}


class Statistics:
    def __init__(self, catalog: ModelCatalog, beats: WorkerBeats) -> None:
        self._catalog = catalog
        self._beats = beats

    async def model_stats(self, model: str = "", version: str = "") -> dict[str, Any]:
        """Triton's ``{"model_stats": [...]}`` for every model, one model, or one version of it."""
        if model:
            entry, number = self._catalog.version(model, version)  # an unknown one is refused in Triton's words
            names: Iterable[str] = (entry.name,)
        else:
            names = self._catalog.names()
        sums = await self._sums()
        rows: list[dict[str, Any]] = []
        for name in names:
            versions = self._versions(name, sums)
            if model and version:
                versions = [str(number)]
            rows += [sums.get((name, v), _Sums()).render(name, v) for v in versions]
        return {"model_stats": rows}

    async def _sums(self) -> dict[tuple[str, str], _Sums]:
        sums: dict[tuple[str, str], _Sums] = {}
        for beat in (await self._beats()).values():
            if beat.stats is None:
                continue
            for key, stats in beat.stats["models"].items():
                name, _, version = key.rpartition("/")
                if not version.isascii() or not version.isdigit():
                    continue  # a request that failed before its version was known
                sums.setdefault((name, version), _Sums()).add(stats)
        return sums

    def _versions(self, name: str, sums: Mapping[tuple[str, str], _Sums]) -> list[str]:
        try:
            known = {str(v) for v in self._catalog.entry(name).versions}
        except ModelNotFound:  # a model whose config was rejected: only what workers report
            known = set()
        known |= {version for (model, version) in sums if model == name}
        return sorted(known, key=int)
