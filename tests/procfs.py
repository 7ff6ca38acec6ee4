"""Reading a process's children from /proc without racing its threads.

``/proc/<pid>/task/<tid>/children`` lists the children each thread started. A thread can end
between listing ``task/`` and reading its file; its children then belong to another thread (or
were reaped), so a vanished file contributes nothing rather than failing the check."""

from __future__ import annotations

import os
from pathlib import Path


def child_pids(pid: int | None = None) -> set[int]:
    """The pids of ``pid``'s children (this process's by default), over all of its threads."""
    found: set[int] = set()
    try:
        tasks = list(Path(f"/proc/{pid or os.getpid()}/task").iterdir())
    except FileNotFoundError:
        return found  # the process itself is gone
    for task in tasks:
        try:
            listed = (task / "children").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended since the listing
        found.update(int(child) for child in listed.split())
    return found
