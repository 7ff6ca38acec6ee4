"""What a directory looks like on disk, to tell whether a model changed.

A fingerprint lists every file under a directory (symlinks are listed, never
followed) with its size and modification time; two equal fingerprints mean
nothing was added, removed or rewritten in between.
"""

from __future__ import annotations

import os
from pathlib import Path

Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(path: Path) -> Fingerprint:
    found: list[tuple[str, int, int]] = []
    for folder, dirs, files in os.walk(path, followlinks=False):
        dirs.sort()
        for name in (*dirs, *sorted(files)):
            full = os.path.join(folder, name)
            try:
                stat = os.lstat(full)
            except OSError:
                continue  # removed while we looked: the next look sees it gone
            size = -1 if name in dirs else stat.st_size
            found.append((os.path.relpath(full, path), size, stat.st_mtime_ns if size >= 0 else 0))
    return tuple(sorted(found))
