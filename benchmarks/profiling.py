"""Optional sampling of the server with py-spy while a load runs, and a text summary of it."""

from __future__ import annotations

import asyncio
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# py-spy's raw format: "thread (tid): name;frame;...;leaf count", each frame "function (file)"
# with --nolineno. Idle threads (the event loop in epoll, an idle executor) are not sampled.
RATE_HZ = 100
_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*)\)$")
_THREAD = re.compile(r"^thread \(\d+\): (?P<name>.*)$")
_SHORTEN_AFTER = ("site-packages/", f"{Path(__file__).resolve().parent.parent}/")


@dataclass(frozen=True, slots=True)
class FunctionShare:
    function: str
    self_fraction: float
    total_fraction: float


@dataclass(frozen=True, slots=True)
class Profile:
    threads_busy: dict[str, float]
    top: list[FunctionShare]

    def to_json(self) -> dict[str, object]:
        return {"threads_busy": self.threads_busy,
                "top_functions": [{"function": s.function, "self": s.self_fraction, "total": s.total_fraction}
                                  for s in self.top]}


def read_profile(collapsed_path: Path, duration_s: float) -> Profile:
    return Profile(thread_busy(collapsed_path, duration_s), top_functions(collapsed_path))


def py_spy_available() -> bool:
    return shutil.which("py-spy") is not None


async def record(pid: int, delay_s: float, duration_s: float, out_path: Path) -> Path | None:
    """Sample ``pid`` for ``duration_s`` after ``delay_s``; the collapsed stacks land in ``out_path``."""
    await asyncio.sleep(delay_s)
    process = await asyncio.create_subprocess_exec(
        "py-spy", "record", "--pid", str(pid), "--duration", str(max(1, round(duration_s))),
        "--rate", str(RATE_HZ), "--format", "raw", "--nolineno", "--threads", "--nonblocking",
        "--output", str(out_path),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await process.communicate()
    if process.returncode != 0 or not out_path.exists():
        print(f"py-spy failed ({process.returncode}): {stderr.decode(errors='replace').strip()[-300:]}")
        return None
    return out_path


def top_functions(collapsed_path: Path, limit: int = 15) -> list[FunctionShare]:
    """The functions holding the most samples, by self time, with their inclusive share."""
    self_counts: Counter[str] = Counter()
    total_counts: Counter[str] = Counter()
    samples = 0
    for line in collapsed_path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(frame) for frame in stack.split(";") if _FRAME.match(frame)]
        if not frames:
            continue
        samples += count
        self_counts[frames[-1]] += count
        for frame in set(frames):
            total_counts[frame] += count
    if samples == 0:
        return []
    return [FunctionShare(name, count / samples, total_counts[name] / samples)
            for name, count in self_counts.most_common(limit)]


def _short(frame: str) -> str:
    match = _FRAME.match(frame)
    assert match is not None
    file = match["file"]
    for marker in _SHORTEN_AFTER:
        if marker in file:
            file = file.split(marker, 1)[1]
    return f"{match['function']} ({file})"


def thread_busy(collapsed_path: Path, duration_s: float) -> dict[str, float]:
    """Fraction of the recording each thread was busy (on a core or waiting for one)."""
    counts: Counter[str] = Counter()
    for line in collapsed_path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        match = _THREAD.match(stack.split(";", 1)[0])
        if match and count_text.isdigit():
            counts[match["name"]] += int(count_text)
    return {name: count / (RATE_HZ * duration_s) for name, count in counts.most_common()}
