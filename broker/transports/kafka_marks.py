"""Counting deliveries on Kafka, which counts none.

Redis keeps a delivery count for every pending entry, so a message that kills
every worker it reaches is dead-lettered after ``--max-deliveries``. Kafka
keeps only each partition's committed offset; ferry keeps the count it needs
in the metadata string committed with that offset: ``ferry1:<offset>:<count>``
says the message at ``offset`` (the partition's oldest unacked message) has
been handed to a worker ``count`` times.

- A member that starts reading a partition reads the committed mark. With
  none for its starting offset, nobody died there: it commits
  ``<offset>:1`` before handing anything out, and then works as usual. While
  it works, each commit marks the new commit point as handed out once if it
  is (see ``metadata_for``).
- A mark with count ``n`` for the starting offset means ``n`` members handed
  that message out and lost the partition without getting past it, which a
  clean leave never does: a clean leave commits past everything it handed
  out, or puts back the count it found. The partition is then *suspect*: for
  the next ``window`` messages the member hands out one message at a time,
  each only after committing its own mark (``n + 1`` for the first, 1 for the
  rest). A message that kills the worker in this mode was the only one out,
  and the next member reads its count from the mark.
- A delivery's ``attempts`` is the greater of its mark's count and its
  ``ferry-attempts`` header (a retry that was re-published).

A message that was not the oldest unacked one when its worker died can be
computed once more than ``--max-deliveries`` allows: that first death leaves
no mark on it.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "ferry1:"
# A re-published retry carries its count; a record's Kafka key travels as a header too.
ATTEMPTS_HEADER = "ferry-attempts"
KEY_HEADER = "kafka-key"


@dataclass(frozen=True, slots=True)
class Mark:
    offset: int
    count: int

    def encode(self) -> str:
        return f"{PREFIX}{self.offset}:{self.count}" if self.count > 0 else ""

    def undone(self) -> Mark:
        """The mark as it was before this member's hand-out."""
        return Mark(self.offset, self.count - 1)


def decode_mark(metadata: str | None) -> Mark | None:
    """The mark in a commit's metadata; None for anything else (another tool's metadata)."""
    if not metadata or not metadata.startswith(PREFIX):
        return None
    offset, _, count = metadata.removeprefix(PREFIX).partition(":")
    try:
        mark = Mark(int(offset), int(count))
    except ValueError:
        return None
    return mark if mark.offset >= 0 and mark.count > 0 else None


def found_count(found: Mark | None, offset: int) -> int:
    """How often the message at ``offset`` was handed out, by the mark found there."""
    return found.count if found is not None and found.offset == offset else 0


def header_attempts(headers: tuple[tuple[str, bytes], ...]) -> int:
    """The count a re-published retry carries in its last ``ferry-attempts`` header; 1 without one."""
    for name, value in reversed(headers):
        if name.lower() == ATTEMPTS_HEADER:
            try:
                return max(1, int(value))
            except ValueError:
                return 1
    return 1
