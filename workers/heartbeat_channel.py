"""Heartbeats over a broker channel, for brokers without keys that expire (Kafka).

Workers publish each heartbeat to ``ferry.heartbeats``, keyed by worker id,
with its TTL inside; a clean exit publishes one with no models and a TTL of
zero. Every reader (a gateway) follows the channel in a consumer group of its
own, so it sees every worker's beats, and counts a worker live until its last
beat's ``sent_ns + ttl`` passes. A reader that starts late reads the
channel's history first; beats older than their TTL count for nothing, so the
history only needs to be kept as long as a TTL (a short retention is enough).

A channel that goes quiet for every worker at once is more likely the broker
than every worker dying in the same second: while Kafka moves a partition's
leader or a group's coordinator to another broker, nothing is read for
seconds. So TTLs are judged against the last moment a current beat (one
within its TTL) was read, for up to ``quiet_hold_s``: the fleet stays ready
through a broker failover, and a worker that stops while others go on
beating still drops out at its TTL. A lone worker that dies is noticed
``quiet_hold_s`` later than its TTL.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from broker import channels
from broker.reader import ChannelReader
from broker.transport import Delivery, Transport
from workers.heartbeat import Beat, ServedModels, decode_beat, encode_heartbeat, heartbeat_expiry_ns
from workers.telemetry.wire import WorkerStats


# Longer than a Kafka broker failover takes to settle (the broker's session timeout, 9 s by
# default, then new leaders and coordinators found by every client).
QUIET_HOLD_S = 15.0


class ChannelHeartbeats:
    def __init__(self, transport: Transport, reader_id: str = "", prefix: str = channels.PREFIX,
                 wall_ns: Callable[[], int] = time.time_ns, poll_timeout_s: float = 0.5,
                 quiet_hold_s: float = QUIET_HOLD_S) -> None:
        self._transport = transport
        self._channel = channels.heartbeat_channel(prefix)
        self._wall_ns = wall_ns
        self._hold_ns = round(quiet_hold_s * 1e9)
        self._beats: dict[str, tuple[Beat, int]] = {}
        self._heard_ns: int | None = None  # when a current beat was last read, from any worker
        reader_id = reader_id or uuid.uuid4().hex[:12]
        self._reader = ChannelReader(transport, self._channel, f"{self._channel}.{reader_id}", reader_id,
                                     self._record, batch=256, poll_timeout_s=poll_timeout_s)
        self._reading = False

    async def beat(self, worker_id: str, models: ServedModels, ttl_s: float,
                   stats: WorkerStats | None = None) -> None:
        raw = encode_heartbeat(worker_id, models, self._wall_ns(), ttl_s, stats)
        await self._transport.publish(self._channel, raw, key=worker_id)

    async def remove(self, worker_id: str) -> None:
        await self._transport.publish(self._channel, encode_heartbeat(worker_id, {}, self._wall_ns()), key=worker_id)

    async def live(self) -> dict[str, ServedModels]:
        return {worker: beat.models for worker, beat in (await self.beats()).items()}

    async def beats(self) -> dict[str, Beat]:
        if not self._reading:
            self._reading = True
            await self._reader.start()
        now = self._wall_ns()
        judged = now if self._heard_ns is None else max(now - self._hold_ns, min(now, self._heard_ns))
        return {worker: beat for worker, (beat, expiry) in self._beats.items() if expiry > judged}

    async def aclose(self) -> None:
        await self._reader.aclose()

    async def _record(self, delivery: Delivery) -> None:
        beat = decode_beat(delivery.payload)
        if beat is None:
            return
        expiry = heartbeat_expiry_ns(delivery.payload)
        now = self._wall_ns()
        if expiry <= beat.sent_ns:  # a clean exit's beat, TTL 0
            self._beats.pop(beat.worker, None)
        elif expiry > now:
            self._beats[beat.worker] = (beat, expiry)
            self._heard_ns = now
        # A beat already past its TTL (history, or held up in a failover) says nothing new,
        # and beats still arriving late are no sign that the channel is back.
