"""How long each point of a benchmark runs, and the command-line options that choose it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Window:
    """Named as the benchmarks' settings name them, so that ``**asdict(window)`` fills them in."""

    duration_s: float   # measured
    warmup_s: float     # unmeasured, before it


@dataclass(frozen=True, slots=True)
class WindowOptions:
    """``--duration``, ``--warmup`` and ``--quick``: a full run's window, a smoke run's, or the one given."""

    full: Window
    quick: Window

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        full, quick = self.full, self.quick
        parser.add_argument("--duration", type=float, help="measured seconds per point "
                            f"(default {full.duration_s:g}, --quick {quick.duration_s:g})")
        parser.add_argument("--warmup", type=float, help="unmeasured seconds before each point "
                            f"(default {full.warmup_s:g}, --quick {quick.warmup_s:g})")
        parser.add_argument("--quick", action="store_true", help="short durations, for a smoke run")

    def chosen(self, args: argparse.Namespace) -> Window:
        base = self.quick if args.quick else self.full
        return Window(duration_s=base.duration_s if args.duration is None else args.duration,
                      warmup_s=base.warmup_s if args.warmup is None else args.warmup)
