"""Heartbeats over a channel (the Kafka way), on the in-memory transport."""

from __future__ import annotations

import asyncio

from broker.transports.memory import MemoryTransport
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
        gateway = ChannelHeartbeats(transport, "gw", wall_ns=wall, poll_timeout_s=0.05)
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
