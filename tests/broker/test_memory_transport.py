"""Memory-only specifics; what every transport promises is in test_transport_contract."""

from broker.transports.memory import MemoryTransport


async def test_claim_stale_reads_idle_time_from_the_injected_clock():
    now = [0.0]
    transport = MemoryTransport(clock=lambda: now[0])
    await transport.publish("c", b"work")
    await transport.fetch("c", "g", "dead-worker", 1, 0)
    assert await transport.backlog("c", "g") == (0, 1)
    now[0] = 4.9
    assert await transport.claim_stale("c", "g", "live", min_idle_s=5, max_count=10) == []
    now[0] = 5.0
    (claimed,) = await transport.claim_stale("c", "g", "live", min_idle_s=5, max_count=10)
    assert claimed.payload == b"work" and claimed.attempts == 2
    now[0] = 9.9
    assert await transport.claim_stale("c", "g", "other", min_idle_s=5, max_count=10) == []
    await transport.ack(claimed)
    assert await transport.backlog("c", "g") == (0, 0)
