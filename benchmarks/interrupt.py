"""Running a benchmark that starts servers and brokers, so that SIGTERM and Ctrl-C
both unwind through its ``with`` blocks and stop everything it started."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_signals() -> None:
    """SIGTERM (and SIGINT, even where a shell started us with it ignored) unwinds like Ctrl-C."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _interrupt)


def run_main(main: Callable[[], int]) -> None:
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:
        print(f"\ninterrupted ({exc or 'Ctrl-C'}); everything started was stopped", file=sys.stderr)
        sys.exit(130)
