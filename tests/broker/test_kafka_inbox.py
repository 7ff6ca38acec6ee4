"""The Kafka member's inbox and delivery marks, without a broker: commit
points, stale hand-outs, and counting deliveries through commit metadata."""

import threading
import time

import pytest

from broker.transport import Delivery
from broker.transports.kafka_inbox import Inbox, Record
from broker.transports.kafka_marks import Mark, decode_mark

KEY = ("c", 0)


def _record(partition: int, offset: int, channel: str = "c", attempts: int = 1) -> Record:
    return Record(partition, offset, Delivery(channel, "g", f"{partition}-{offset}", b"x", attempts))


def handed_out_once(point: int) -> str:
    return Mark(point, 1).encode()


@pytest.mark.parametrize(
    ("acked", "commit"),
    [
        ([], None),
        ([0], (1, handed_out_once(1))),  # 1 is out: marked as handed out once
        ([1, 2], None),  # a gap at 0: nothing may be committed
        ([2, 0], (1, handed_out_once(1))),  # stops at the gap at 1
        ([2, 0, 1], (3, "")),  # nothing at 3 handed out yet
        ([0, 0, 1], (2, handed_out_once(2))),  # acking twice is harmless
    ],
)
def test_commit_point_is_the_end_of_the_acked_prefix(acked: list[int], commit: tuple[int, str] | None):
    inbox = Inbox()
    inbox.add(_record(0, offset) for offset in range(3))
    inbox.take(["c"], 3)
    for offset in acked:
        inbox.ack("c", 0, offset)
    assert inbox.due_commits() == ({} if commit is None else {KEY: commit})
    assert inbox.due_commits() == {}  # sent once


def test_a_commit_point_handed_out_after_its_commit_is_sent_again_marked():
    inbox = Inbox()
    inbox.add(_record(0, offset) for offset in range(3))
    inbox.take(["c"], 1)
    inbox.ack("c", 0, 0)
    assert inbox.due_commits() == {KEY: (1, "")}
    inbox.take(["c"], 1)
    assert inbox.due_commits() == {KEY: (1, handed_out_once(1))}


def test_inbox_ignores_acks_for_records_not_handed_out_and_drops_revoked_partitions():
    inbox = Inbox()
    inbox.add([_record(0, 0), _record(1, 0), _record(1, 1)])
    inbox.ack("c", 1, 0)  # still buffered: not acked
    assert inbox.due_commits() == {}
    assert [d.message_id for d in inbox.take(["c"], 1)] == ["0-0"]
    inbox.ack("c", 0, 0)
    assert inbox.drop([("c", 0), ("c", 1)]) == {KEY: (1, "")}
    assert inbox.buffered == (0, 0) and inbox.take(["c"], 10) == []


def test_waiting_for_acks_ends_at_the_last_ack_or_at_the_timeout():
    inbox = Inbox()
    inbox.add(_record(partition, 0) for partition in (0, 1))
    inbox.take(["c"], 2)
    started = time.monotonic()
    assert inbox.wait_acked([("c", 0), ("c", 1)], 0.2) == 2
    assert 0.2 <= time.monotonic() - started < 2
    threading.Timer(0.1, inbox.ack, ("c", 0, 0)).start()
    assert inbox.wait_acked([("c", 0)], 10) == 0  # the other partition's record is not waited for
    assert time.monotonic() - started < 5
    assert inbox.wait_acked([("c", 2)], 10) == 0  # nothing held there


def test_inbox_hands_out_again_what_idled_unacked_one_attempt_higher():
    now = [100.0]
    inbox = Inbox(clock=lambda: now[0])
    inbox.add(_record(0, offset) for offset in range(3))
    inbox.take(["c"], 2)
    now[0] += 5
    inbox.ack("c", 0, 1)
    assert inbox.stale("c", 10, 10) == [] and inbox.stale("other", 0, 10) == []
    now[0] += 5
    (again,) = inbox.stale("c", 10, 10)  # 0-1 was acked, 0-2 never handed out
    assert (again.message_id, again.attempts) == ("0-0", 2)
    assert inbox.stale("c", 10, 10) == []
    now[0] += 10
    assert [d.attempts for d in inbox.stale("c", 10, 10)] == [3]
    inbox.ack("c", 0, 0)
    assert inbox.stale("c", 0, 10) == [] and inbox.due_commits() == {KEY: (2, "")}


def test_inbox_serves_the_first_channel_that_has_records():
    inbox = Inbox()
    inbox.add([_record(0, 0, "lo"), _record(0, 1, "lo"), _record(0, 0, "hi")])
    assert [d.channel for d in inbox.take(["hi", "lo"], 10)] == ["hi"]
    assert [d.message_id for d in inbox.take(["hi", "lo"], 10)] == ["0-0", "0-1"]


# -- marks ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "mark"),
    [
        ("ferry1:12:3", Mark(12, 3)),
        ("", None),
        (None, None),
        ("someone else's", None),
        ("ferry1:12", None),
        ("ferry1:x:1", None),
        ("ferry1:12:0", None),
        ("ferry1:-1:2", None),
    ],
)
def test_marks_decode_only_what_ferry_wrote(metadata: str | None, mark: Mark | None):
    assert decode_mark(metadata) == mark
    if mark is not None:
        assert decode_mark(mark.encode()) == mark


def opened(found: Mark | None, records: int = 4, start: int = 10, window: int = 2) -> Inbox:
    inbox = Inbox()
    inbox.open(KEY, start, found, window)
    inbox.add(_record(0, start + n) for n in range(records))
    return inbox


def mark_committed(inbox: Inbox) -> Mark:
    """What the member's thread does: commit the wanted mark, then report it."""
    ((key, mark),) = inbox.wanted().items()
    inbox.marked(key, mark)
    return mark


def test_a_fresh_partition_hands_nothing_out_before_its_first_mark_then_everything():
    inbox = opened(found=None)
    assert inbox.take(["c"], 10) == []
    assert mark_committed(inbox) == Mark(10, 1)
    assert [(d.message_id, d.attempts) for d in inbox.take(["c"], 10)] == [(f"0-{n}", 1) for n in range(10, 14)]
    assert inbox.wanted() == {}


def test_a_mark_for_another_offset_counts_for_nothing():
    inbox = opened(found=Mark(7, 3))
    assert mark_committed(inbox) == Mark(10, 1)
    assert len(inbox.take(["c"], 10)) == 4


def test_after_a_death_the_window_goes_out_one_at_a_time_each_after_its_mark():
    inbox = opened(found=Mark(10, 2), window=2)
    assert inbox.take(["c"], 10) == []
    assert mark_committed(inbox) == Mark(10, 3)  # the head: twice before, now a third time
    (first,) = inbox.take(["c"], 10)
    assert (first.message_id, first.attempts) == ("0-10", 3)
    assert inbox.take(["c"], 10) == [] and inbox.wanted() == {}  # one out at a time
    inbox.ack("c", 0, 10)
    assert inbox.take(["c"], 10) == []
    assert mark_committed(inbox) == Mark(11, 1)
    (second,) = inbox.take(["c"], 10)
    assert (second.message_id, second.attempts) == ("0-11", 1)
    inbox.ack("c", 0, 11)
    # Past the window: the rest go out together, as usual.
    assert [d.message_id for d in inbox.take(["c"], 10)] == ["0-12", "0-13"]


def test_an_ack_in_single_file_says_the_next_record_may_go_and_one_past_it_does_not():
    inbox = opened(found=Mark(10, 1), window=1)
    mark_committed(inbox)
    inbox.take(["c"], 10)
    assert inbox.ack("c", 0, 10) is True  # the window is passed
    assert [d.message_id for d in inbox.take(["c"], 10)] == ["0-11", "0-12", "0-13"]
    assert inbox.ack("c", 0, 11) is False


def test_a_retry_header_counts_when_it_is_higher_than_the_mark():
    inbox = Inbox()
    inbox.open(KEY, 0, Mark(0, 1), window=1)
    inbox.add([_record(0, 0, attempts=4)])
    mark_committed(inbox)
    assert [d.attempts for d in inbox.take(["c"], 1)] == [4]


def test_held_back_partitions_do_not_block_the_others_or_later_channels():
    inbox = Inbox()
    inbox.open(("hi", 0), 0, Mark(0, 1), window=5)
    inbox.add([_record(0, 0, "hi"), _record(0, 1, "hi"), _record(1, 0, "hi"), _record(0, 0, "lo")])
    assert [d.message_id for d in inbox.take(["hi", "lo"], 10)] == ["1-0"]  # hi/0 waits for its mark
    inbox.ack("hi", 1, 0)
    assert [(d.channel, d.message_id) for d in inbox.take(["hi", "lo"], 10)] == [("lo", "0-0")]
    inbox.marked(("hi", 0), Mark(0, 2))
    assert [d.message_id for d in inbox.take(["hi", "lo"], 10)] == ["0-0"]


@pytest.mark.parametrize(
    ("handed_out", "acked", "leaving"),
    [
        (False, False, (10, "")),  # the first mark put back: nobody handed 10 out
        (True, False, (10, "ferry1:10:1")),  # handed out, never acked: it counts
        (True, True, (11, "")),  # done with 10, 11 never handed out
    ],
)
def test_leaving_commits_what_the_next_reader_should_count(handed_out: bool, acked: bool, leaving: tuple[int, str]):
    inbox = opened(found=None, records=2)
    mark_committed(inbox)
    if handed_out:
        inbox.take(["c"], 1)
    if acked:
        inbox.ack("c", 0, 10)
    assert inbox.drop([KEY]) == {KEY: leaving}


def test_leaving_a_suspect_partition_puts_back_the_count_it_found_unless_it_handed_the_head_out():
    inbox = opened(found=Mark(10, 2))
    mark_committed(inbox)
    assert inbox.drop([KEY]) == {KEY: (10, "ferry1:10:2")}
    inbox = opened(found=Mark(10, 2))
    mark_committed(inbox)
    inbox.take(["c"], 1)
    assert inbox.drop([KEY]) == {KEY: (10, "ferry1:10:3")}
