"""CPU seconds used by this process and by another one (or a tree of them), to split a 2-core
budget between them."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class CpuSample:
    client_s: float
    server_s: float | None


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (all its threads), from /proc; None off Linux."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; the fields after its closing one are fixed.
    fields = stat.rpartition(")")[2].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name: [0] state, [1] ppid, [11] utime,
    [12] stime, [13] cutime, [14] cstime (clock ticks); None once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()


def process_tree(roots: Iterable[int]) -> set[int]:
    """``roots`` and every live descendant of theirs (children, grandchildren...)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    pending = list(roots)
    while pending:
        pid = pending.pop()
        if pid not in found:
            found.add(pid)
            pending += children.get(pid, [])
    return found


def tree_cpu_s(roots: Iterable[int]) -> float | None:
    """CPU seconds of ``roots`` and all their descendants; None when no root is alive (or off Linux).

    Each live process adds its own user + system time and that of its children it has waited
    for (cutime, cstime): a child that exits and is reaped between two samples moves its time
    into its parent's, so the difference of two samples still counts it, once."""
    total, alive = 0, False
    for pid in process_tree(roots):
        fields = _stat_fields(pid)
        if fields is None:
            continue
        alive = True
        total += sum(int(value) for value in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK") if alive else None


def sample(server_pid: int) -> CpuSample:
    """This process's CPU time, and that of the server with every process it started."""
    return CpuSample(client_s=time.process_time(), server_s=tree_cpu_s([server_pid]))


def cores_used(before: CpuSample, after: CpuSample, elapsed_s: float) -> tuple[float, float | None]:
    """Average cores busy in the client and in the server between two samples."""
    client = (after.client_s - before.client_s) / elapsed_s
    if before.server_s is None or after.server_s is None:
        return client, None
    return client, (after.server_s - before.server_s) / elapsed_s
