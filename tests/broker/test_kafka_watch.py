"""When a Kafka group member starts over with a fresh consumer (``kafka_watch``).

The consumer here stands in for kafka-python's KafkaConsumer (a library, not
ferry's code), reporting the group state and positions a wedged one reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.transports.kafka_api import MemberState, TopicPartition
from broker.transports.kafka_watch import STALL_CHECK_S, Watch

TP = TopicPartition("ferry.m.requests", 0)


@dataclass
class Metadata:
    state: MemberState


@dataclass
class Consumer:
    state: MemberState = MemberState.STABLE
    position_at: int = 0
    end: int = 0
    paused_set: set[TopicPartition] = field(default_factory=set)

    def group_metadata(self) -> Metadata:
        return Metadata(self.state)

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def paused(self) -> set[TopicPartition]:
        return self.paused_set

    def end_offsets(self, partitions: list[TopicPartition], timeout_ms: int) -> dict[TopicPartition, int]:
        return {tp: self.end for tp in partitions}

    def position(self, tp: TopicPartition, timeout_ms: int) -> int:
        return self.position_at


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_member_out_of_a_stable_group_past_the_join_timeout_is_stuck() -> None:
    clock = Clock()
    watch = Watch(join_timeout_s=30.0, request_timeout_ms=1_000, clock=clock)
    consumer = Consumer(MemberState.REBALANCING)
    assert watch.verdict(consumer) is None
    clock.now += 29.0
    assert watch.verdict(consumer) is None
    clock.now += 2.0
    assert watch.verdict(consumer) == "stuck_joining"


def test_a_join_that_completes_in_time_starts_the_count_again() -> None:
    clock = Clock()
    watch = Watch(join_timeout_s=30.0, request_timeout_ms=1_000, clock=clock)
    consumer = Consumer(MemberState.UNJOINED)
    watch.verdict(consumer)
    clock.now += 25.0
    consumer.state = MemberState.STABLE
    assert watch.verdict(consumer) is None
    consumer.state = MemberState.REBALANCING
    clock.now += 25.0
    assert watch.verdict(consumer) is None  # 25 s into this rebalance, not 50


def test_a_fresh_consumer_is_given_the_whole_join_timeout() -> None:
    clock = Clock()
    watch = Watch(join_timeout_s=30.0, request_timeout_ms=1_000, clock=clock)
    consumer = Consumer(MemberState.REBALANCING)
    watch.verdict(consumer)
    clock.now += 20.0
    watch.reset()
    assert watch.verdict(consumer) is None
    clock.now += 20.0
    assert watch.verdict(consumer) is None


def test_an_unpaused_partition_behind_its_end_that_does_not_move_is_stalled() -> None:
    clock = Clock()
    watch = Watch(join_timeout_s=30.0, request_timeout_ms=1_000, clock=clock)
    consumer = Consumer(position_at=5, end=9)
    assert watch.verdict(consumer) is None  # first look: behind, maybe moving
    clock.now += STALL_CHECK_S + 0.1
    assert watch.verdict(consumer) == "stalled"


def test_a_moving_caught_up_or_paused_partition_is_not_stalled() -> None:
    clock = Clock()
    watch = Watch(join_timeout_s=30.0, request_timeout_ms=1_000, clock=clock)
    consumer = Consumer(position_at=5, end=9)
    watch.verdict(consumer)
    for change in (lambda: setattr(consumer, "position_at", 6), lambda: setattr(consumer, "position_at", 9),
                   lambda: consumer.paused_set.add(TP)):
        change()
        clock.now += STALL_CHECK_S + 0.1
        assert watch.verdict(consumer) is None
