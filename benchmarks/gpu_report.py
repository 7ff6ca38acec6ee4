"""What ``bench_gpu.py`` found: its rows, the two tables it prints, its key figures and its JSON."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.stats import Summary
from benchmarks.table import Column, header, line

TORCH, SERVE, IDENTITY, FLEET = "torch", "serve", "identity", "fleet"
ROLES = ("serve", "gateway", "worker", "valkey")
TARGETS = {SERVE: 0.8, FLEET: 0.7, IDENTITY: 15_000.0}

THROUGHPUT_COLUMNS = (
    Column("mode", 40, align="<"), Column("point", 15, align="<"), Column("per s", 10, ".1f"),
    Column("p50 ms", 8, ".1f"), Column("p99 ms", 8, ".1f"), Column("x torch in-process best", 23, ".2f"))
CPU_COLUMNS = (
    Column("cores busy, GPU busy", 40, align="<"), Column("point", 15, align="<"), Column("client", 7, ".2f"),
    *(Column(role, 8, ".2f") for role in ROLES), Column("machine", 8, ".2f"),
    Column("GPU busy", 9, ".0%"))


@dataclass(frozen=True, slots=True)
class Row:
    kind: str                                   # TORCH, SERVE, IDENTITY or FLEET
    summary: Summary                            # images/s (requests/s on identity rows), latencies
    clients: int | None = None                  # keep-alive clients; None on torch rows
    setup: dict[str, int] = field(default_factory=dict)        # http_workers, or gateways and workers
    cores: dict[str, float] = field(default_factory=dict)      # role -> cores busy in the window
    machine_cores: float | None = None
    gpu_busy: float | None = None                # 0 to 1, from nvidia-smi
    first_error: str | None = None

    def to_json(self, torch_best: float | None) -> dict[str, Any]:
        document = {**self.summary.to_json(), "kind": self.kind, "clients": self.clients, **self.setup,
                    "x_torch_best": self.ratio(torch_best), "cores": self.cores,
                    "machine_cores": self.machine_cores, "gpu_busy": self.gpu_busy, "first_error": self.first_error}
        for unused in ("ratio_to_best_ort", "compute_cores", "compute_ms_per_image"):
            document.pop(unused)
        return document

    def ratio(self, torch_best: float | None) -> float | None:
        if self.kind == IDENTITY or not torch_best:
            return None
        return self.summary.images_per_s / torch_best


@dataclass(slots=True)
class Report:
    rows: list[Row] = field(default_factory=list)
    installed: list[str] = field(default_factory=list)      # distributions installed from wheels
    failures: list[str] = field(default_factory=list)       # servers that did not start, and why
    # Other work on the machine skews every figure; the 1-minute load says how much there was.
    load_start: tuple[float, float, float] = field(default_factory=os.getloadavg)

    @property
    def errors(self) -> int:
        return sum(row.summary.errors for row in self.rows)

    @property
    def torch_best(self) -> Row | None:
        return max((r for r in self.rows if r.kind == TORCH), key=lambda r: r.summary.images_per_s, default=None)

    @property
    def torch_best_per_s(self) -> float | None:
        best = self.torch_best
        return best.summary.images_per_s if best is not None else None


def row_line(row: Row, torch_best: float | None) -> str:
    s = row.summary
    errors = f"  ({s.errors} errors; first: {row.first_error})" if s.errors else ""
    values = (s.mode, s.point, s.images_per_s, s.p50_ms, s.p99_ms, row.ratio(torch_best))
    return line(THROUGHPUT_COLUMNS, values) + errors


def print_report(report: Report, key_clients: int) -> None:
    best = report.torch_best_per_s
    print(f"\n{header(THROUGHPUT_COLUMNS)}")
    for row in report.rows:
        print(row_line(row, best))
    print(f"\n{header(CPU_COLUMNS)}")
    for row in report.rows:
        if row.kind != TORCH:
            roles = (row.cores.get(role) for role in ROLES)
            print(line(CPU_COLUMNS, (row.summary.mode, row.summary.point, row.summary.client_cores, *roles,
                                     row.machine_cores, row.gpu_busy)))
    if any(row.summary.mode.endswith(("*", "*, identity")) for row in report.rows):
        print("* ferry's default --http-workers on this machine")
    print()
    for failure in report.failures:
        print(f"FAILED {failure}")
    for name, figure in key_figures(report, key_clients).items():
        value, target = figure["value"], figure["target"]
        shown = "-" if value is None else f"{value:,.2f}"
        verdict = {True: "met", False: "NOT met", None: "not measured"}[figure["met"]]
        print(f"{name}: {shown} (target >= {target:,g}, {verdict}) {figure['row'] or ''}")


KEY_FIGURES = ((SERVE, "ferry serve / torch in-process best"), (FLEET, "fleet / torch in-process best"),
               (IDENTITY, "identity requests/s"))


def _best(report: Report, kind: str, clients: int | None) -> Row | None:
    rows = [row for row in report.rows if row.kind == kind and clients in (None, row.clients)]
    return max(rows, key=lambda row: row.summary.images_per_s, default=None)


def key_figures(report: Report, clients: int) -> dict[str, dict[str, Any]]:
    """The best row of each kind at ``clients`` clients (at any count for identity), against its
    target: throughput as a share of the torch baseline, identity in requests/s."""
    figures = {}
    for kind, name in KEY_FIGURES:
        top = _best(report, kind, None if kind == IDENTITY else clients)
        if top is None:
            value = None
        else:
            value = top.summary.images_per_s if kind == IDENTITY else top.ratio(report.torch_best_per_s)
        figures[name] = {"value": value, "target": TARGETS[kind],
                         "met": None if value is None else value >= TARGETS[kind],
                         "row": None if top is None else f"{top.summary.mode}, {top.summary.point}"}
    return figures


def _gpu() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {}
    found: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        found["device"] = torch.cuda.get_device_name(0)
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        found["nvidia_smi"] = subprocess.run(query, capture_output=True, text=True).stdout.strip()
    return found


def _machine() -> dict[str, Any]:
    import numpy

    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "numpy": numpy.__version__, **_gpu()}


def write_json(path: Path, settings: dict[str, Any], report: Report) -> None:
    best = report.torch_best
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "gpu",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(),
        "installed_from_wheels": report.installed,
        "load_average": {"start": list(report.load_start), "end": list(os.getloadavg())},
        "settings": settings,
        "failures": report.failures,
        "rows": [row.to_json(report.torch_best_per_s) for row in report.rows],
        "torch_best": best and {"point": best.summary.point, "images_per_s": best.summary.images_per_s},
        "key_figures": key_figures(report, settings["key_clients"]),
    }
    path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
