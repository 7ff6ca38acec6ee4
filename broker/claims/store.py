"""The claim-store seam: where claim-checked bytes wait for their receiver.

A claim is ``<scheme>:<id>``; the scheme says which store can redeem it, so a
process never mistakes one store's claim for another's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class ClaimStore(Protocol):
    scheme: str
    owner: str  # this process's ``process_tag``

    async def put(self, blobs: Sequence[bytes | memoryview], ttl_s: float, owner: str) -> list[str]:
        """Store each blob for at most ``ttl_s``, for ``owner``: the process that sent the
        request they belong to, and waits for its reply. Returns one claim per blob, in order."""

    async def get(self, claims: Sequence[str], delete: bool = False) -> list[bytes]:
        """The blobs, in order, and with ``delete`` dropped in the same step;
        raises ClaimMissing naming the first one gone."""

    async def delete(self, claims: Sequence[str]) -> None:
        """Drop the blobs; claims already gone are ignored."""

    async def aclose(self) -> None:
        """Release connections; blobs stay until deleted or expired."""


def process_start(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (None when it is gone): with
    its pid, it names one process, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def process_tag(pid: int | None = None) -> str:
    """``<pid>.<start time>``: this process (or ``pid``), and no other before or after it."""
    pid = pid or os.getpid()
    return f"{pid}.{process_start(pid)}"


def claim_id(claim: str, scheme: str) -> str:
    """The id part of ``claim``; ValueError when it belongs to another scheme."""
    prefix = f"{scheme}:"
    if not claim.startswith(prefix) or len(claim) == len(prefix):
        raise ValueError(f"claim '{claim}' is not a '{scheme}' claim")
    return claim[len(prefix):]
