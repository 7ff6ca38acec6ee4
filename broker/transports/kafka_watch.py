"""When a group member should start over with a fresh KafkaConsumer.

kafka-python 3.0 can wedge in two ways that a new consumer, reading on from
the committed offsets, recovers from:

- **stalled fetching**: after a broker restart, fetches answered
  FENCED_LEADER_EPOCH over and over, so an unpaused partition behind its log
  end does not move for a whole check interval;
- **stuck joining**: under heavy CPU load, a member that has sent SyncGroup
  sometimes neither completes the join nor heartbeats again. The broker
  drops it when its session times out, but the client stays "rebalancing"
  for good: it never sends another JoinGroup, and every commit fails with
  RebalanceInProgressError. A join that waits on other members ends within a
  session timeout (the broker drops those that do not rejoin in time), so a
  member out of a stable group for ``join_timeout_s`` is stuck.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from broker.transports.kafka_api import KafkaConsumer, KafkaError, MemberState, TopicPartition

# How often the watch checks that unpaused partitions make progress.
STALL_CHECK_S = 5.0


class Watch:
    def __init__(self, join_timeout_s: float, request_timeout_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._join_timeout_s = join_timeout_s
        self._request_timeout_ms = request_timeout_ms
        self._clock = clock
        self._unstable_since: float | None = None
        self._next_stall_check = 0.0
        self._behind: dict[TopicPartition, int] = {}

    def reset(self) -> None:
        """A fresh consumer: nothing observed yet."""
        self._unstable_since = None
        self._next_stall_check = 0.0
        self._behind = {}

    def verdict(self, consumer: KafkaConsumer) -> str | None:
        """Why ``consumer`` should be replaced ("stuck_joining", "stalled"), or None."""
        now = self._clock()
        if consumer.group_metadata().state != MemberState.STABLE:
            self._behind = {}
            if self._unstable_since is None:
                self._unstable_since = now
            return "stuck_joining" if now - self._unstable_since > self._join_timeout_s else None
        self._unstable_since = None
        if now < self._next_stall_check:
            return None
        self._next_stall_check = now + STALL_CHECK_S
        return "stalled" if self._stalled(consumer) else None

    def _stalled(self, consumer: KafkaConsumer) -> bool:
        active = consumer.assignment() - consumer.paused()
        if not active:
            self._behind = {}
            return False
        ends = consumer.end_offsets(list(active), timeout_ms=self._request_timeout_ms)
        behind = {tp: position for tp in active
                  if (position := _position(consumer, tp)) < ends.get(tp, 0)}  # fmt: skip
        stalled = bool(behind) and behind == self._behind
        self._behind = {} if stalled else behind
        return stalled


def _position(consumer: KafkaConsumer, tp: TopicPartition) -> int:
    try:
        return int(consumer.position(tp, timeout_ms=1_000))
    except KafkaError:
        return -1
