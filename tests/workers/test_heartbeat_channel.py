"""Heartbeats over a channel (the Kafka way), on the in-memory transport."""

from __future__ import annotations

import asyncio

from broker.transports.memory import MemoryTransport
from workers.heartbeat import encode_heartbeat
from workers.heartbeat_channel import ChannelHeartbeats


class Wall:
    def __init__(self) -> None:
        self.ns = 10**18

    def __call__(self) -> int:
        return self.ns


async def settled(reader: ChannelHeartbeats, expected: dict[str, dict[str, tuple[int, ...]]]) -> None:
    async with asyncio.timeout(5):
        while await reader.live() != expected:
            await asyncio.sleep(0.01)


async def test_a_reader_sees_live_workers_until_their_ttl_or_their_exit():
    wall = Wall()
    async with MemoryTransport() as transport:
        worker = ChannelHeartbeats(transport, "w1", wall_ns=wall, poll_timeout_s=0.05)
        await worker.beat("w1", {"add_sub": (1,)}, ttl_s=3)
        await worker.beat("w2", {"cnn": (1, 2)}, ttl_s=3)
        # A reader that starts after the beats still finds them in the channel.
        gateway = ChannelHeartbeats(transport, "gw", wall_ns=wall, poll_timeout_s=0.05, quiet_hold_s=0)
        try:
            await settled(gateway, {"w1": {"add_sub": (1,)}, "w2": {"cnn": (1, 2)}})
            await worker.remove("w1")
            await settled(gateway, {"w2": {"cnn": (1, 2)}})
            wall.ns += 3 * 10**9  # w2's last beat is now older than its TTL
            assert await gateway.live() == {}
            await worker.beat("w2", {"cnn": (2,)}, ttl_s=3)
            await settled(gateway, {"w2": {"cnn": (2,)}})
        finally:
            await gateway.aclose()
            await worker.aclose()


async def test_a_beat_older_than_its_ttl_is_ignored_when_read():
    wall = Wall()
    async with MemoryTransport() as transport:
        writer = ChannelHeartbeats(transport, "w", wall_ns=wall)
        await writer.beat("w1", {"m": (1,)}, ttl_s=1)
        await transport.publish("ferry.heartbeats", b"not a heartbeat")
        wall.ns += 2 * 10**9
        reader = ChannelHeartbeats(transport, "gw", wall_ns=wall, poll_timeout_s=0.05)
        try:
            await reader.live()
            await asyncio.sleep(0.2)
            assert await reader.live() == {}
        finally:
            await reader.aclose()


async def test_a_channel_quiet_for_every_worker_holds_their_last_beats_a_while():
    # A broker failover silences the channel for all; one worker that stops while
    # another goes on beating has died, and drops out at its TTL.
    wall = Wall()
    async with MemoryTransport() as transport:
        worker = ChannelHeartbeats(transport, "w", wall_ns=wall, poll_timeout_s=0.05)
        gateway = ChannelHeartbeats(transport, "gw", wall_ns=wall, poll_timeout_s=0.05, quiet_hold_s=15)
        try:
            await worker.beat("w1", {"m": (1,)}, ttl_s=3)
            await worker.beat("w2", {"m": (1,)}, ttl_s=3)
            await settled(gateway, {"w1": {"m": (1,)}, "w2": {"m": (1,)}})
            wall.ns += 10 * 10**9  # nothing read for 10 s: past both TTLs, within the hold
            assert set(await gateway.live()) == {"w1", "w2"}
            wall.ns += 9 * 10**9  # the hold is over: both count as gone
            assert await gateway.live() == {}
            await worker.beat("w1", {"m": (1,)}, ttl_s=3)
            await worker.beat("w2", {"m": (1,)}, ttl_s=3)
            await settled(gateway, {"w1": {"m": (1,)}, "w2": {"m": (1,)}})
            for _ in range(4):  # w1 goes on beating, w2 has stopped
                wall.ns += 1 * 10**9
                await worker.beat("w1", {"m": (1,)}, ttl_s=3)
                await asyncio.sleep(0.1)
            await settled(gateway, {"w1": {"m": (1,)}})
            # A beat of w1's held up past its TTL (read late, after a failover) does not end it.
            late = encode_heartbeat("w1", {"m": (1,)}, wall.ns - 5 * 10**9, ttl_s=3)
            await transport.publish("ferry.heartbeats", late, key="w1")
            await asyncio.sleep(0.2)
            assert await gateway.live() == {"w1": {"m": (1,)}}
        finally:
            await gateway.aclose()
            await worker.aclose()
