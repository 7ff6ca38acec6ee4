"""CPU seconds used by this process and by another one, to split a 2-core budget between them."""

from __future__ import annotations

import os
import time
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


def sample(server_pid: int) -> CpuSample:
    return CpuSample(client_s=time.process_time(), server_s=process_cpu_s(server_pid))


def cores_used(before: CpuSample, after: CpuSample, elapsed_s: float) -> tuple[float, float | None]:
    """Average cores busy in the client and in the server between two samples."""
    client = (after.client_s - before.client_s) / elapsed_s
    if before.server_s is None or after.server_s is None:
        return client, None
    return client, (after.server_s - before.server_s) / elapsed_s
