"""A bounded soak: does ``ferry serve`` hold its memory flat under a long mix of good, bad and
abandoned requests?

``ferry serve`` on a copy of ``model_repo/cnn`` and ``model_repo/add_sub`` takes ``--clients``
(8) clients' traffic for ``--minutes`` (10): binary and JSON inferences, async jobs polled to
the end, wrong shapes, unknown models, malformed JSON, too many parameters, and connections
dropped mid-body or before the reply (``soak_traffic.py``). The server's resident memory, its
child processes included, is sampled every ``--sample-s``. The baseline is the same server
after the warm-up, in the same run: growth is the median of the last few samples over the
median of the first few after the warm-up. Exit status 1 when growth reaches ``--max-growth``
(10%), or any response was a 5xx, any request hung, any answer was wrong or any
connection failed before its response.

    python benchmarks/bench_soak.py                  # ten minutes
    python benchmarks/bench_soak.py --minutes 1      # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from time import monotonic

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script, benchmarks/ is on the path but not the repository
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import cpu  # noqa: E402
from benchmarks.loadgen import event_loop_runner  # noqa: E402
from benchmarks.server import RunningServer, copy_model, ferry_server  # noqa: E402
from benchmarks.soak_traffic import (  # noqa: E402
    ABANDONED, KINDS, WEIGHTS, Client, ClientPlan, Tally, Traffic, new_tallies,
)

MODELS = (REPO_ROOT / "model_repo" / "cnn", REPO_ROOT / "model_repo" / "add_sub")
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "soak.json"
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SoakSettings:
    minutes: float = 10.0
    warmup_minutes: float = 1.0
    clients: int = 8
    sample_s: float = 5.0
    smoothing: int = 5              # samples in each median
    max_growth: float = 0.10
    hang_s: float = 30.0
    job_timeout_s: float = 60.0
    # Finished jobs are kept a TTL and read "expired" for one more, so memory holds 2 x TTL of
    # jobs by design: a short TTL lets that plateau before the warm-up ends.
    job_ttl_s: float = 20.0
    max_requests_per_client: int = 1_000_000
    seed: int = 1
    skip: tuple[str, ...] = ()      # request kinds left out of the mix
    out: Path = DEFAULT_OUT

    @property
    def duration_s(self) -> float:
        return self.minutes * 60

    @property
    def warmup_s(self) -> float:
        return min(self.warmup_minutes * 60, self.duration_s / 2)

    @property
    def weights(self) -> dict[str, int]:
        return {kind: weight for kind, weight in WEIGHTS.items() if kind not in self.skip}


def settings_from_args(argv: Sequence[str] | None) -> SoakSettings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = SoakSettings()
    parser.add_argument("--minutes", type=float, default=defaults.minutes, help="how long the traffic runs")
    parser.add_argument("--warmup-minutes", type=float, default=defaults.warmup_minutes,
                        help="the baseline is taken after this (at most half the run)")
    parser.add_argument("--clients", type=int, default=defaults.clients, help="concurrent clients")
    parser.add_argument("--sample-s", type=float, default=defaults.sample_s, help="seconds between RSS samples")
    parser.add_argument("--max-growth", type=float, default=defaults.max_growth,
                        help="fail at this RSS growth (0.10 = 10%%)")
    parser.add_argument("--hang-s", type=float, default=defaults.hang_s,
                        help="a request unanswered after this has hung")
    parser.add_argument("--job-timeout-s", type=float, default=defaults.job_timeout_s,
                        help="an async job not final after this has hung")
    parser.add_argument("--job-ttl-s", type=float, default=defaults.job_ttl_s, help="the server's --job-ttl-s")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--skip", type=_kinds, default=(),
                        help=f"request kinds to leave out, comma-separated: {', '.join(WEIGHTS)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the JSON goes")
    args = parser.parse_args(argv)
    return SoakSettings(minutes=args.minutes, warmup_minutes=args.warmup_minutes, clients=args.clients,
                        sample_s=args.sample_s, max_growth=args.max_growth, hang_s=args.hang_s,
                        job_timeout_s=args.job_timeout_s, job_ttl_s=args.job_ttl_s, seed=args.seed,
                        skip=args.skip, out=args.out)


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(part for part in text.replace(" ", ",").split(",") if part)
    unknown = [kind for kind in kinds if kind not in WEIGHTS]
    if unknown or set(kinds) == set(WEIGHTS):
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(WEIGHTS)}, got {text!r}")
    return kinds


def tree_rss_bytes(pid: int) -> tuple[int, int]:
    """Resident bytes of ``pid`` and its descendants (pages they share counted in each), and
    how many processes that is; psutil when installed, /proc otherwise."""
    try:
        import psutil
    except ImportError:
        pids = _descendants(pid)
        return sum(_proc_rss(p) for p in pids), len(pids)
    root = psutil.Process(pid)
    processes = [root, *root.children(recursive=True)]
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total, len(processes)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                # The command name may hold spaces and parentheses; the fields after its closing one are fixed.
                parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, frontier = [pid], [pid]
    while frontier:
        frontier = [child for parent in frontier for child in children.get(parent, ())]
        found += frontier
    return found


def _proc_rss(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float         # since the traffic started
    rss_bytes: int
    processes: int


@dataclass(frozen=True, slots=True)
class Memory:
    after_warmup: float
    end: float
    peak: int
    idle_after: int
    growth: float

    @classmethod
    def of(cls, samples: list[Sample], idle: Sample, settings: SoakSettings) -> Memory:
        warm = [s.rss_bytes for s in samples if s.at_s >= settings.warmup_s][: settings.smoothing]
        end = [s.rss_bytes for s in samples][-settings.smoothing:]
        after_warmup, last = statistics.median(warm or end), statistics.median(end)
        return cls(after_warmup, last, max(s.rss_bytes for s in samples), idle.rss_bytes, last / after_warmup - 1)

    def to_json(self) -> dict[str, float]:
        return {"after_warmup_mib": self.after_warmup / MIB, "end_mib": self.end / MIB, "peak_mib": self.peak / MIB,
                "idle_after_mib": self.idle_after / MIB, "growth": self.growth}


@dataclass(frozen=True, slots=True)
class Outcome:
    tallies: dict[str, Tally]
    samples: list[Sample]
    memory: Memory
    stuck_clients: int
    server_cpu_s: float | None
    elapsed_s: float

    @property
    def statuses(self) -> Counter[int]:
        return sum((tally.statuses for tally in self.tallies.values()), Counter())

    @property
    def server_errors(self) -> int:
        return sum(count for status, count in self.statuses.items() if status >= 500)

    @property
    def hangs(self) -> int:
        return sum(tally.hangs for tally in self.tallies.values()) + self.stuck_clients

    @property
    def wrong(self) -> int:
        return sum(tally.wrong for tally in self.tallies.values())

    @property
    def dropped(self) -> int:
        return sum(tally.dropped for tally in self.tallies.values())


async def sample_memory(pid: int, settings: SoakSettings, started: float, samples: list[Sample],
                        tallies: dict[str, Tally]) -> None:
    next_report = 60.0
    while True:
        rss, processes = tree_rss_bytes(pid)
        at = monotonic() - started
        samples.append(Sample(at, rss, processes))
        if at >= next_report:
            next_report += 60.0
            answered = sum(t.answered for t in tallies.values())
            errors = sum(c for t in tallies.values() for s, c in t.statuses.items() if s >= 500)
            print(f"  {at / 60:4.1f} min  RSS {rss / MIB:7.1f} MiB  {answered} answered, {errors} 5xx", flush=True)
        await asyncio.sleep(settings.sample_s)


async def soak(server: RunningServer, settings: SoakSettings) -> Outcome:
    traffic = Traffic.build(server.host, server.port)
    tallies = new_tallies()
    started = monotonic()
    cpu_before = cpu.process_cpu_s(server.pid)
    plan = ClientPlan(started + settings.duration_s, settings.max_requests_per_client, settings.hang_s,
                      settings.job_timeout_s, settings.weights)
    samples: list[Sample] = []
    sampler = asyncio.create_task(sample_memory(server.pid, settings, started, samples, tallies))
    clients = [asyncio.create_task(Client(traffic, plan, tallies, settings.seed * 1000 + index).run())
               for index in range(settings.clients)]
    grace_s = max(settings.hang_s, settings.job_timeout_s) + 15
    done, pending = await asyncio.wait(clients, timeout=settings.duration_s + grace_s)
    elapsed_s = monotonic() - started
    for task in [*pending, sampler]:
        task.cancel()
    await asyncio.gather(*pending, sampler, return_exceptions=True)
    for task in done:
        if (error := task.exception()) is not None:
            raise error
    await asyncio.sleep(settings.sample_s)   # idle: what in-flight work held is given back
    idle = Sample(monotonic() - started, *tree_rss_bytes(server.pid))
    cpu_after = cpu.process_cpu_s(server.pid)
    server_cpu_s = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return Outcome(tallies, samples, Memory.of(samples, idle, settings), len(pending), server_cpu_s, elapsed_s)


def log_levels(log_path: Path) -> dict[str, int]:
    """How many of the server's JSON log records each level has (lines that are not JSON: "other")."""
    levels: Counter[str] = Counter()
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            levels[str(json.loads(line).get("level", "other"))] += 1
        except (ValueError, AttributeError):
            levels["other"] += 1
    return dict(levels)


def print_report(outcome: Outcome, settings: SoakSettings, levels: dict[str, int]) -> None:
    print(f"\n{'request kind':<24} {'sent':>8} {'answered':>9} {'as expected':>12} {'wrong':>6} {'hangs':>6} "
          f"{'dropped':>8}  statuses")
    for kind, tally in outcome.tallies.items():
        answered = "-" if kind in ABANDONED else str(tally.answered)
        expected = "-" if kind in ABANDONED else str(tally.as_expected)
        statuses = ", ".join(f"{status}: {count}" for status, count in sorted(tally.statuses.items()))
        print(f"{kind:<24} {tally.sent:>8} {answered:>9} {expected:>12} {tally.wrong:>6} {tally.hangs:>6} "
              f"{tally.dropped:>8}  {statuses}")
    for kind, tally in outcome.tallies.items():
        if tally.first_problem:
            print(f"  first problem, {kind}: {tally.first_problem}")
    memory = outcome.memory
    print(f"\nserver RSS (children included): after warm-up {memory.after_warmup / MIB:.1f} MiB, "
          f"end {memory.end / MIB:.1f} MiB, peak {memory.peak / MIB:.1f} MiB, "
          f"idle after {memory.idle_after / MIB:.1f} MiB")
    answered = sum(t.answered for t in outcome.tallies.values())
    print(f"{answered} responses in {outcome.elapsed_s:.0f} s ({answered / outcome.elapsed_s:.0f}/s); "
          f"5xx {outcome.server_errors}, hangs {outcome.hangs}, wrong answers {outcome.wrong}, "
          f"dropped connections {outcome.dropped}; "
          f"server log records by level: {levels}")
    print(f"key figure: RSS growth {memory.growth:+.1%} from {settings.warmup_s / 60:.1f} min to the end "
          f"(target < {settings.max_growth:.0%})")


def passed(outcome: Outcome, settings: SoakSettings) -> bool:
    failures = outcome.server_errors + outcome.hangs + outcome.wrong + outcome.dropped
    return outcome.memory.growth < settings.max_growth and failures == 0


def write_json(outcome: Outcome, settings: SoakSettings, levels: dict[str, int],
               load_start: tuple[float, ...]) -> None:
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    non_2xx = {str(status): count for status, count in sorted(outcome.statuses.items()) if status >= 300}
    document = {
        "benchmark": "soak", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "load_average_1m": {"start": load_start[0], "end": os.getloadavg()[0]},
        "settings": {"minutes": settings.minutes, "warmup_s": settings.warmup_s, "clients": settings.clients,
                     "sample_s": settings.sample_s, "smoothing": settings.smoothing, "hang_s": settings.hang_s,
                     "job_timeout_s": settings.job_timeout_s, "job_ttl_s": settings.job_ttl_s,
                     "seed": settings.seed, "weights": settings.weights, "models": [m.name for m in MODELS]},
        "memory": outcome.memory.to_json(),
        "rss_samples": [[round(s.at_s, 1), round(s.rss_bytes / MIB, 2), s.processes] for s in outcome.samples],
        "requests": {kind: outcome.tallies[kind].to_json() for kind in KINDS},
        "errors_by_status": non_2xx, "server_errors_5xx": outcome.server_errors, "hangs": outcome.hangs,
        "stuck_clients": outcome.stuck_clients, "wrong_answers": outcome.wrong, "dropped": outcome.dropped,
        "elapsed_s": outcome.elapsed_s,
        "server_cpu_s": outcome.server_cpu_s, "server_log_levels": levels,
        "key_figure": {"name": "RSS growth, end over after warm-up", "value": outcome.memory.growth,
                       "target": settings.max_growth, "met": outcome.memory.growth < settings.max_growth},
        "passed": passed(outcome, settings),
    }
    settings.out.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_args(argv)
    load_start = os.getloadavg()
    log_path = settings.out.with_suffix(".server.log")   # kept beside the JSON, for when it fails
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"soak: ferry serve on {', '.join(m.name for m in MODELS)}, {settings.clients} clients, "
          f"{settings.minutes:g} min, RSS every {settings.sample_s:g} s; server log in {log_path}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ferry-bench-soak-") as scratch:
        for model in MODELS:
            copy_model(model, Path(scratch), dynamic_batching=True)
        server_args = ["--job-ttl-s", str(settings.job_ttl_s)]
        with ferry_server(Path(scratch), log_path, extra_args=server_args) as server, \
                event_loop_runner() as runner:
            outcome = runner.run(soak(server, settings))
    levels = log_levels(log_path)
    print_report(outcome, settings, levels)
    write_json(outcome, settings, levels, load_start)
    print(f"wrote {settings.out}")
    return 0 if passed(outcome, settings) else 1


if __name__ == "__main__":
    sys.exit(main())
