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


def listens_on(pid: int, port: int) -> bool:
    """Whether ``pid`` holds a TCP socket listening on ``port`` (any address): a socket bound and
    not yet listening, or one inherited and left alone, does not count."""
    listening = _listening_inodes(port)
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return False
    for fd in fds:
        try:
            target = os.readlink(fd)
        except (FileNotFoundError, ProcessLookupError):
            continue  # closed since the listing
        if target.startswith("socket:[") and target[8:-1] in listening:
            return True
    return False


def _listening_inodes(port: int) -> set[str]:
    """The inodes of the sockets in LISTEN state (``0A``) on ``port``, IPv4 and IPv6."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes
