"""Request ids: 32 hex digits, as ``uuid.uuid4().hex`` gives, without a system call each.

An id only has to be unique among a fleet's requests in flight; nothing relies on it
being hard to guess (a job's id, which a client fetches its result by, is a uuid4).
128 bits from the ``random`` module's generator, which is seeded from the system's
randomness at start and again in every forked child, are unique enough for that."""

from __future__ import annotations

import random


def new_request_id() -> str:
    return f"{random.getrandbits(128):032x}"
