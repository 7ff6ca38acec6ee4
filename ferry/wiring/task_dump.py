"""SIGUSR2 makes a worker log what each of its asyncio tasks waits on, innermost
call last: for a process that neither answers nor stops, where it is stuck
(``kill -USR2 PID``, then read its log)."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import structlog

log = structlog.get_logger("ferry.tasks")

MAX_DEPTH = 24


def install_task_dump(loop: asyncio.AbstractEventLoop) -> None:
    loop.add_signal_handler(signal.SIGUSR2, dump_tasks)


def dump_tasks() -> None:
    tasks = asyncio.all_tasks()
    log.warning("tasks.dump", tasks=len(tasks))
    for task in sorted(tasks, key=lambda t: t.get_name()):
        log.warning("tasks.task", task=task.get_name(), awaiting=awaiting(task.get_coro()))


def awaiting(coro: Any) -> list[str]:
    """The chain of awaits from ``coro`` down to what it is suspended on, as file:line function."""
    chain: list[str] = []
    while coro is not None and len(chain) < MAX_DEPTH:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is None:
            chain.append(repr(coro)[:120])  # a future, or a coroutine that has finished
            break
        chain.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
    return chain
