"""Relative paths from configs and load requests, checked before they touch the disk.

A path that comes from outside (a ``file:`` override, a warmup's
``input_data_file``, an initial state's ``data_file``) must stay inside the
directory it is relative to: no absolute paths, no ``..``, no backslashes or
NUL, no hidden names (``.``, ``.git``), and no symlink on the way.
"""

from __future__ import annotations

from pathlib import Path

MAX_PARTS = 16
MAX_LENGTH = 1024
_FORBIDDEN = ("\\", "\0", ":")


def path_problem(relative: str) -> str | None:
    """Why ``relative`` may not be used as a path inside a directory, or None."""
    if not relative:
        return "it is empty"
    if len(relative) > MAX_LENGTH:
        return f"it is longer than {MAX_LENGTH} characters"
    if relative.startswith("/"):
        return "it is absolute"
    for bad in _FORBIDDEN:
        if bad in relative:
            return f"it contains {bad!r}"
    parts = relative.split("/")
    if len(parts) > MAX_PARTS:
        return f"it has more than {MAX_PARTS} parts"
    for part in parts:
        if part == "..":
            return "it contains '..'"
        if not part:
            return "it has an empty part ('//' or a trailing '/')"
        if part.startswith("."):
            return f"part {part!r} starts with '.'"
    return None


def inside(base: Path, relative: str) -> Path:
    """``base / relative`` once checked; ``ValueError`` saying why it is refused.

    The existing part of the result is resolved, so a symlink that leads out
    of ``base`` is refused too."""
    problem = path_problem(relative)
    if problem is not None:
        raise ValueError(f"{relative!r} is not a plain relative path: {problem}")
    root = base.resolve()
    target = root.joinpath(*relative.split("/"))
    for step in (target, *target.parents):
        if step == root:
            break
        if step.is_symlink():
            raise ValueError(f"{relative!r} passes through a symlink")
    if not target.resolve().is_relative_to(root):
        raise ValueError(f"{relative!r} leads outside {base}")
    return target
