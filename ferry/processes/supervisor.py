"""Forked children kept running: each child is forked from a supervisor that
starts no threads and no event loop, forked again when it dies, and stopped
with SIGTERM (then SIGKILL after a grace period) when the supervisor is
asked to stop. A child that keeps failing right after it starts (a port taken,
a broker URL that is wrong) stops the whole group rather than spinning.

A ``Kept`` process (the bundled Valkey server) is one the supervisor's owner
started and stops, after the children: the supervisor only restarts it when
it dies, through the same reaping.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from workers.linux import die_with_parent, name_process

log = structlog.get_logger("ferry.processes")

RESTART_PAUSE_S = 0.5
# A child that exits sooner than this after its start failed to start.
QUICK_EXIT_S = 3.0
QUICK_EXITS_TO_GIVE_UP = 5
STOP_GRACE_S = 30.0
POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class Child:
    name: str
    run: Callable[[], object]  # runs in the forked process; its end is the process's end


class Kept(Protocol):
    name: str

    @property
    def pid(self) -> int | None: ...

    def restart(self) -> None:
        """Start it again, its last process exited and reaped; raises when it cannot start."""


@dataclass(slots=True)
class _Running:
    child: Child
    pid: int
    started: float
    quick_exits: int = 0


class Supervisor:
    def __init__(self, children: Sequence[Child], clock: Callable[[], float] = time.monotonic,
                 kept: Sequence[Kept] = ()) -> None:
        self._children = list(children)
        self._kept = list(kept)
        self._clock = clock
        self._running: dict[int, _Running] = {}
        self._stopping = False
        self._gave_up = False

    def run(self) -> int:
        """Run every child until SIGTERM or SIGINT; the exit status for the command."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._ask_to_stop)
        for child in self._children:
            self._start(child)
        while not self._stopping:
            if not self._reap_one():
                time.sleep(POLL_S)
        self._stop_all()
        return 1 if self._gave_up else 0

    def _ask_to_stop(self, signum: int, frame: object) -> None:
        self._stopping = True

    def _start(self, child: Child, quick_exits: int = 0) -> None:
        pid = os.fork()
        if pid == 0:
            _become(child)
        self._running[pid] = _Running(child, pid, self._clock(), quick_exits)
        log.info("process.started", process=child.name, pid=pid)

    def _reap_one(self) -> bool:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return False
        if pid not in self._running:
            self._restart_kept(pid, status)
            return False
        gone = self._running.pop(pid)
        if self._stopping:
            return True
        lived = self._clock() - gone.started
        quick = gone.quick_exits + 1 if lived < QUICK_EXIT_S else 0
        log.warning("process.exited", process=gone.child.name, pid=pid, status=_describe(status),
                    lived_s=round(lived, 1))
        if quick >= QUICK_EXITS_TO_GIVE_UP:
            log.error("process.gave_up", process=gone.child.name, quick_exits=quick)
            self._stopping = self._gave_up = True
            return True
        time.sleep(RESTART_PAUSE_S)
        self._start(gone.child, quick)
        return True

    def _restart_kept(self, pid: int, status: int) -> None:
        kept = next((k for k in self._kept if k.pid == pid), None)
        if kept is None or self._stopping:
            return
        log.warning("process.exited", process=kept.name, pid=pid, status=_describe(status))
        try:
            kept.restart()
        except Exception as exc:
            log.error("process.gave_up", process=kept.name, error=str(exc))
            self._stopping = self._gave_up = True
            return
        log.info("process.started", process=kept.name, pid=kept.pid)

    def _stop_all(self) -> None:
        for pid in self._running:
            _signal(pid, signal.SIGTERM)
        deadline = self._clock() + STOP_GRACE_S
        while self._running and self._clock() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(POLL_S)
            else:
                self._running.pop(pid, None)
        for pid in self._running:
            log.warning("process.killed", pid=pid)
            _signal(pid, signal.SIGKILL)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self._running.clear()


def _become(child: Child) -> None:
    """The forked child's whole life; it never returns to the supervisor's code."""
    code = 0
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        die_with_parent()
        name_process(f"ferry-{child.name}")
        child.run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit {os.waitstatus_to_exitcode(status)}"
