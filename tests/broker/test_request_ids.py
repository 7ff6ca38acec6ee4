"""Request ids: uuid4's shape, unique, and a forked child's differ from its parent's."""

from __future__ import annotations

import multiprocessing
import re

from broker.request_ids import new_request_id


def _child_id(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put(new_request_id())


def test_ids_are_32_hex_digits_and_do_not_repeat() -> None:
    ids = [new_request_id() for _ in range(20_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", each) for each in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    """An HTTP process forked from another must not hand out the ids its parent will."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_id, args=(queue,))
    child.start()
    theirs = queue.get(timeout=30)
    child.join(timeout=30)
    assert theirs != new_request_id()
