"""``loadgen.run_load`` from several processes at once, for loads one Python process cannot send
(hundreds of 301 KB requests in flight; tens of thousands of small ones a second).

The clients are shared out among ``processes`` children (started with ``spawn``: the parent may
hold a CUDA context, which a forked child must not inherit), each an event loop of its own.
They meet at a barrier once started, so that their warm-ups and measured windows line up; the
parent, released with them, reads the CPU of the servers and of the children at the window's
edges. Their results are merged into one ``LoadResult``.
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from typing import Any

from benchmarks.cpu import tree_cpu_s
from benchmarks.loadgen import LoadResult, LoadSpec, Target, event_loop_runner, run_load

START_TIMEOUT_S = 120.0     # children starting on a busy machine
RESULT_TIMEOUT_S = 60.0     # beyond the load's own warm-up, window and grace


@dataclass(frozen=True, slots=True)
class Measured:
    result: LoadResult
    server_cpu_s: dict[str, float]     # by role, over the measured window
    client_cpu_s: float
    start: float                       # the measured window as the parent saw it (perf_counter)
    end: float

    @property
    def elapsed_s(self) -> float:
        return self.end - self.start


def shares(clients: int, processes: int) -> list[int]:
    """``clients`` split as evenly as can be over at most ``processes`` processes."""
    processes = max(1, min(processes, clients))
    return [clients // processes + (1 if index < clients % processes else 0) for index in range(processes)]


def _child(target: Target, spec: LoadSpec, barrier: Barrier, results: multiprocessing.Queue[Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the parent's to handle: it ends the children
    with event_loop_runner() as runner:
        barrier.wait(START_TIMEOUT_S)
        result = runner.run(run_load(target, spec))
    results.put((result.latencies_s, result.errors, result.first_error))


def run_load_processes(target: Target, spec: LoadSpec, processes: int,
                       server_cpu: Callable[[], dict[str, float]]) -> Measured:
    """``spec.concurrency`` clients over ``processes`` children; ``server_cpu`` is read at both
    edges of the measured window."""
    context = multiprocessing.get_context("spawn")
    counts = shares(spec.concurrency, processes)
    barrier = context.Barrier(len(counts) + 1)
    results: multiprocessing.Queue[Any] = context.Queue()
    children = [context.Process(target=_child, args=(target, _with_concurrency(spec, n), barrier, results),
                                daemon=True) for n in counts]
    try:
        for child in children:
            child.start()
        barrier.wait(START_TIMEOUT_S)
        time.sleep(spec.warmup_s)
        pids = [child.pid for child in children if child.pid is not None]
        before, client_before, start = server_cpu(), tree_cpu_s(pids) or 0.0, time.perf_counter()
        time.sleep(spec.duration_s)
        after, client_after, end = server_cpu(), tree_cpu_s(pids) or 0.0, time.perf_counter()
        merged = _merged(results, len(children), spec.grace_s + RESULT_TIMEOUT_S)
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
            child.join()
    server = {role: after.get(role, 0.0) - seconds for role, seconds in before.items()}
    return Measured(merged, server, client_after - client_before, start, end)


def _with_concurrency(spec: LoadSpec, concurrency: int) -> LoadSpec:
    return LoadSpec(concurrency, spec.warmup_s, spec.duration_s, spec.grace_s)


def _merged(results: multiprocessing.Queue[Any], count: int, timeout_s: float) -> LoadResult:
    merged = LoadResult()
    deadline = time.monotonic() + timeout_s
    for _ in range(count):
        try:
            latencies, errors, first_error = results.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            merged.fail("a load process sent no result")
            continue
        merged.latencies_s.extend(latencies)
        merged.errors += errors
        if merged.first_error is None:
            merged.first_error = first_error
    return merged
