"""A request the broker lost in a failure is found missing once the broker is back, and sent
again, or answered with an error where sending it again is not safe; one still in its channel,
or answered meanwhile, is left alone. On a real redis-server: the loss is an XDEL of the entry,
the failure a CLIENT KILL of every connection, as a restart would drop them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import redis.asyncio as aioredis
import structlog.testing

from broker import channels
from broker.envelope import Response, encode_response
from broker.errors import TransportError
from broker.lost_requests import GRACE_S, Resend, SentLedger
from broker.replies import ReplyRouter
from broker.transports.redis import PAYLOAD_FIELD, RedisTransport
from tests.redis_server import flushdb

OWNER = "gw-lost"
REQUESTS = channels.request_channel("m")
REPLIES = channels.reply_channel(OWNER)
# The reader waits 0.5 s after a failure, then looks; GRACE_S later it sends again.
SETTLED_S = GRACE_S + 5.0


@dataclass
class Gateway:
    """A reply router on a real transport, and what it sent."""
    transport: RedisTransport
    router: ReplyRouter
    raw: aioredis.Redis
    resent: list[str] = field(default_factory=list)

    async def send(self, request_id: str, resendable: bool = True) -> str:
        """Publish a request awaited as ``request_id``; its message id."""
        message_id = await self.transport.publish(REQUESTS, request_id.encode())

        async def resend() -> str:
            self.resent.append(request_id)
            return await self.transport.publish(REQUESTS, request_id.encode())

        self.router.sent(request_id, REQUESTS, message_id, "m", resend if resendable else None)
        return message_id

    async def fail_connections(self) -> None:
        """Every client's connection dropped, as by a restart; the router's reader fails."""
        await self.raw.client_kill_filter(_type="normal", skipme=True)

    async def answer(self, request_id: str) -> None:
        await self.raw.xadd(REPLIES, {PAYLOAD_FIELD: encode_response(Response(id=request_id, model="m"))})

    async def requests_in_stream(self) -> list[bytes]:
        return [fields[PAYLOAD_FIELD] for _, fields in await self.raw.xrange(REQUESTS)]


async def fail_a_read(transport: RedisTransport, raw: aioredis.Redis) -> None:
    """A blocking read of ``transport`` cut off by the server: one more of its failures."""
    before = transport.failures
    read = asyncio.create_task(transport.fetch(REPLIES, "g", "c", 1, 10.0))
    async with asyncio.timeout(5):
        while b"cmd=xreadgroup" not in await raw.execute_command("CLIENT", "LIST"):
            await asyncio.sleep(0.02)
    await raw.client_kill_filter(_type="normal", skipme=True)
    with pytest.raises(TransportError):
        await read
    assert transport.failures == before + 1


@pytest.fixture
async def gateway(redis_url: str) -> AsyncIterator[Gateway]:
    flushdb(redis_url)
    transport = RedisTransport(redis_url)
    router = ReplyRouter(transport, OWNER, poll_timeout_s=0.2)
    raw = aioredis.Redis.from_url(redis_url, protocol=2)
    await router.start()
    try:
        async with asyncio.timeout(5):
            while not await raw.exists(REPLIES):  # the router reads (its group exists)
                await asyncio.sleep(0.02)
        yield Gateway(transport, router, raw)
    finally:
        await router.aclose()
        await transport.aclose()
        await raw.aclose()


async def test_a_request_the_broker_lost_is_sent_again_once_it_is_back(gateway: Gateway):
    waiting = gateway.router.expect("q1")
    lost_id = await gateway.send("q1")
    assert await gateway.raw.xdel(REQUESTS, lost_id) == 1  # the broker comes back without it
    await gateway.fail_connections()
    async with asyncio.timeout(SETTLED_S):
        while not await gateway.requests_in_stream():
            await asyncio.sleep(0.05)
    assert gateway.resent == ["q1"]
    assert await gateway.requests_in_stream() == [b"q1"]
    await gateway.answer("q1")
    async with asyncio.timeout(5):
        response = await waiting
    assert response.id == "q1" and response.error is None
    # Answered, it is forgotten: a later failure sends nothing again.
    gateway.router.forget("q1")
    await gateway.fail_connections()
    await asyncio.sleep(GRACE_S + 1.5)
    assert gateway.resent == ["q1"]


async def test_a_lost_request_that_may_not_be_sent_again_is_answered_with_an_error(gateway: Gateway):
    waiting = gateway.router.expect("step")
    lost_id = await gateway.send("step", resendable=False)
    await gateway.raw.xdel(REQUESTS, lost_id)
    started = time.monotonic()
    await gateway.fail_connections()
    async with asyncio.timeout(SETTLED_S):
        response = await waiting
    assert time.monotonic() - started >= GRACE_S  # given its grace to be answered first
    assert response.id == "step" and response.model == "m"
    assert response.error is not None and response.error.code == "unavailable"
    assert lost_id in response.error.message and REQUESTS in response.error.message
    assert "not safe" in response.error.message
    assert gateway.resent == [] and await gateway.requests_in_stream() == []


async def test_requests_in_their_channel_or_answered_within_the_grace_are_not_sent_again(gateway: Gateway):
    queued = gateway.router.expect("queued")
    answered = gateway.router.expect("answered")
    await gateway.send("queued")  # unread: still in the stream
    done_id = await gateway.send("answered")
    # Read, answered and trimmed away; its reply not yet read when the router looks.
    await gateway.raw.xdel(REQUESTS, done_id)
    await gateway.fail_connections()
    await asyncio.sleep(1.0)
    await gateway.answer("answered")
    async with asyncio.timeout(5):
        assert (await answered).error is None
    await asyncio.sleep(GRACE_S + 1.5)
    assert gateway.resent == []
    assert await gateway.requests_in_stream() == [b"queued"]
    assert not queued.done()


async def test_a_ledger_with_a_horizon_and_its_own_view_of_answers(redis_url: str):
    """As async jobs use it: records older than the horizon are dropped, and only requests the
    owner calls unanswered are sent again; one that cannot be sent again is failed."""
    flushdb(redis_url)
    now = [0.0]
    resent: list[str] = []
    failed: list[Response] = []
    answered_elsewhere = {"done"}

    async def fail(response: Response) -> None:
        failed.append(response)

    async def unanswered(request_ids: list[str]) -> list[str]:
        return [request_id for request_id in request_ids if request_id not in answered_elsewhere]

    async with RedisTransport(redis_url) as transport:
        ledger = SentLedger(transport, fail, grace_s=0.1, watch_s=0.05, clock=lambda: now[0],
                            unanswered=unanswered, horizon_s=60.0)
        await ledger.start()

        async def lost(request_id: str, resend: Resend | None = None) -> None:
            message_id = await transport.publish(REQUESTS, request_id.encode())
            assert await transport.holds(REQUESTS, [message_id]) == [True]
            async with aioredis.Redis.from_url(redis_url) as raw:
                await raw.xdel(REQUESTS, message_id)
            assert await transport.holds(REQUESTS, [message_id, "0-1"]) == [False, False]

            async def publish_again() -> str:
                resent.append(request_id)
                return await transport.publish(REQUESTS, request_id.encode())

            ledger.record(request_id, REQUESTS, message_id, "m", resend or publish_again)

        async def broken() -> str:
            raise TransportError("redis: Connection refused")

        await lost("old")
        now[0] = 30.0
        await lost("done")
        await lost("unsendable", broken)
        now[0] = 61.0
        await lost("new")  # "old" is past the horizon now
        now[0] = 62.0
        await asyncio.sleep(0.3)
        assert resent == [] and failed == []  # nothing failed: nothing looked for
        async with aioredis.Redis.from_url(redis_url) as raw:
            await fail_a_read(transport, raw)
        async with asyncio.timeout(5):
            while not failed or not resent:
                await asyncio.sleep(0.02)
        await ledger.aclose()
    assert resent == ["new"]
    (failure,) = failed
    assert failure.id == "unsendable" and failure.error is not None and failure.error.code == "unavailable"
    assert "sending it again failed" in failure.error.message and "Connection refused" in failure.error.message


async def test_a_request_gone_only_after_the_first_look_is_found_by_the_second(redis_url: str):
    """On a Redis Cluster a reply lost with its master leaves its request acked on another, gone
    from its stream at the next trim: a look just after the failure still finds it there."""
    flushdb(redis_url)
    resent: list[str] = []

    async def fail(response: Response) -> None:
        raise AssertionError(f"failed {response}")

    async with RedisTransport(redis_url) as transport, aioredis.Redis.from_url(redis_url) as raw:
        ledger = SentLedger(transport, fail, grace_s=0.1, watch_s=0.05, relook_s=1.0)
        await ledger.start()
        message_id = await transport.publish(REQUESTS, b"q")

        async def resend() -> str:
            resent.append("q")
            return await transport.publish(REQUESTS, b"q")

        ledger.record("q", REQUESTS, message_id, "m", resend)
        await fail_a_read(transport, raw)
        await asyncio.sleep(0.5)  # looked: there
        await raw.xdel(REQUESTS, message_id)  # acked and trimmed; its reply lost
        assert resent == []
        async with asyncio.timeout(5):
            while not resent:
                await asyncio.sleep(0.02)
        await asyncio.sleep(1.5)  # and sent once: its new entry is there
        await ledger.aclose()
    assert resent == ["q"]


async def test_a_failure_while_nothing_awaits_a_reply_is_seen_and_said(redis_url: str):
    """Every caller's request still being published when the broker failed (a cluster client
    retrying it, say): nothing recorded can be lost; the ledger says it saw the failure, once."""
    flushdb(redis_url)

    async def fail(response: Response) -> None:
        raise AssertionError(f"failed {response}")

    async with RedisTransport(redis_url) as transport, aioredis.Redis.from_url(redis_url) as raw:
        ledger = SentLedger(transport, fail, watch_s=0.05)
        await ledger.start()
        with structlog.testing.capture_logs() as events:
            await asyncio.sleep(0.2)
            await fail_a_read(transport, raw)
            await asyncio.sleep(0.3)
        await ledger.aclose()
    seen = [e for e in events if e["event"].startswith("lost_requests.")]
    assert seen == [{"event": "lost_requests.none_unanswered", "failures": transport.failures,
                     "log_level": "info"}]
