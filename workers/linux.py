"""What a child process asks of Linux (prctl): to die with its parent, even one that
was SIGKILLed, and a name that ``ps -o comm`` and ``top`` show. Elsewhere both do nothing."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
NAME_BYTES = 15  # the kernel keeps 16 bytes, the last a NUL


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    _prctl(PR_SET_PDEATHSIG, int(sig))


def name_process(name: str) -> None:
    _prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:NAME_BYTES]))


def _prctl(option: int, value: object) -> None:
    found = ctypes.util.find_library("c")
    if found is None:
        return
    try:
        ctypes.CDLL(found, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass
