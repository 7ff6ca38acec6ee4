"""Whether a process that shares a claim directory still runs, whichever PID namespace it is in.

A claim names its processes by pid and start time (``store.process_tag``), which ``/proc``
answers for the processes of this PID namespace only. Containers that share ``/dev/shm`` but
not their PID namespace (Docker's ``ipc: shareable`` or a Kubernetes pod's memory volume,
without ``pid: service:…`` or ``shareProcessNamespace``) see each other's pids as gone, or as
some other process: a sweep would remove a live writer's arena, and a writer would reuse the
blocks of a reader that is still to read them.

So each process that opens a claim store keeps a presence file, ``ferry-proc-<pid>.<start>``,
locked (``flock``) for as long as it runs: the kernel drops the lock when the process ends,
SIGKILL included, and a lock is seen from every namespace that shares the file. A tag that
``/proc`` does not show running is alive if its presence file is locked; a presence file no
longer locked is swept.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from pathlib import Path

import structlog

log = structlog.get_logger("ferry.broker.claims")

PREFIX = "ferry-proc-"
NAME = re.compile(r"ferry-proc-(\d+)\.(\d+)")
LOCK_TRIES, LOCK_TRIES_S = 20, 1.0


class Presence:
    """This process's presence file in ``directory``, locked until the last of its stores closes."""

    _held: dict[Path, tuple[int, int]] = {}  # path: (descriptor, stores of this process that use it)

    def __init__(self, directory: Path, tag: str) -> None:
        self._path = directory / f"{PREFIX}{tag}"
        self._open = True
        held = Presence._held.get(self._path)
        if held is not None:
            Presence._held[self._path] = (held[0], held[1] + 1)
            return
        fd = _locked(self._path)
        if fd is None:  # then this process is seen through /proc alone, as before presence files
            log.warning("claims.no_presence", path=str(self._path))
            self._open = False
            return
        Presence._held[self._path] = (fd, 1)

    def close(self) -> None:
        held = Presence._held.get(self._path)
        if not self._open or held is None:
            return
        self._open = False
        fd, users = held
        if users > 1:
            Presence._held[self._path] = (fd, users - 1)
            return
        del Presence._held[self._path]
        try:
            self._path.unlink()
        except FileNotFoundError:
            pass
        os.close(fd)


def _locked(path: Path) -> int | None:
    """A descriptor of ``path``, made and locked; None when it cannot be (a directory not writable,
    or the lock held elsewhere for a second: another namespace's process of the same tag)."""
    for _ in range(LOCK_TRIES):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a sweep's probe holds it for a moment only
            if os.stat(path).st_ino == os.fstat(fd).st_ino:  # not removed by a sweep before it was locked
                return fd
        except (BlockingIOError, FileNotFoundError):
            time.sleep(LOCK_TRIES_S / LOCK_TRIES)
        os.close(fd)
    return None


def sweep(directory: Path, name: str) -> bool:
    """Remove the presence file ``name`` if its process is gone; whether it was removed."""
    path = directory / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        if not _held(fd):
            path.unlink()
            return True
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)  # (and the lock, if taken, with it)
    return False


def present(directory: Path, tag: str) -> bool:
    """Whether the process ``tag`` holds its presence file in ``directory``."""
    try:
        fd = os.open(directory / f"{PREFIX}{tag}", os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # gone (or never made: a process of an older ferry)
        return False
    try:
        return _held(fd)
    finally:
        os.close(fd)


def _held(fd: int) -> bool:
    """Whether another open file holds the lock of ``fd``'s file; if not, ``fd`` now does."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    return False


def _drop_in_child() -> None:
    """A forked child is not its parent: the parent's presence must end with the parent."""
    for fd, _ in Presence._held.values():
        os.close(fd)
    Presence._held.clear()


os.register_at_fork(after_in_child=_drop_in_child)
