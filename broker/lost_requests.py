"""Requests a broker may have lost: looked for once it answers again, then sent again or failed.

A broker can come back from a failure without messages it had acknowledged: Redis with
``appendfsync everysec`` holds back its AOF write for up to 2 s while an fsync is slow, so a
crash of redis-server alone can lose the last writes; a replica promoted by a failover lacks
what had not reached it yet. A request lost so is read by no worker, and its caller would wait
out its whole reply timeout.

So whoever awaits replies (``broker.replies.ReplyRouter``) records each request it sent, until
its first reply: the channel, the message id, and how to send it again where that is safe. Every
``watch_s`` the ledger looks at its transport's count of failed calls (``Holding.failures``: a
read, a publish, an ack, in this process). Once it has grown, each request sent before then and
still unanswered is looked for in its channel (``Holding.holds``); while the broker still fails,
it looks again on the next round, and once more ``relook_s`` after a look that succeeded (on a
Redis Cluster a reply and the ack of its request go to two masters: a reply lost with one leaves
its request acked, gone from its stream only at the next trim). A request not there was either
answered, acked and trimmed (its reply is then in the reply channel, about to be read) or lost.
One still unanswered ``grace_s`` later is taken as lost and sent again, under the same request
id (should both copies be computed, the second reply is dropped like any duplicate); or, where
sending again is not safe (a sequence's step changes the sequence's state, and may have been
applied), it is answered with an ``unavailable`` error that says so. Either way its caller hears
within seconds.

An owner that does not see its requests answered (an async job's reply goes to whichever gateway
reads it first) says which are still ``unanswered`` instead, and keeps records only for
``horizon_s``: what a broker loses is what it acknowledged in its last seconds.

A transport that cannot tell (the in-memory one, Kafka, whose acknowledged writes survive a
broker's crash) keeps no ledger: nothing is recorded and nothing watched.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from broker.envelope import ErrorInfo, Response
from broker.errors import BrokerError
from broker.transport import Holding, Transport

log = structlog.get_logger("ferry.broker.lost_requests")

# How often the transport's failures are looked at.
WATCH_S = 1.0
# After a look, another this much later.
RELOOK_S = 5.0
# A reply read after the broker is back reaches its caller within milliseconds; one not there
# after this long is not coming.
GRACE_S = 2.0
# Looked for with this many commands at once at most.
CHUNK = 1024

Resend = Callable[[], Awaitable[str]]  # publishes the request again; returns its new message id
Fail = Callable[[Response], Awaitable[None]]  # answers a request with an error in place of its reply
Unanswered = Callable[[list[str]], Awaitable[list[str]]]  # of these request ids, those still unanswered


@dataclass(slots=True)
class Sent:
    channel: str
    message_id: str
    model: str
    resend: Resend | None  # None where sending again is not safe
    at: float  # when it was (last) sent, on the ledger's clock


class SentLedger:
    """The requests sent and not yet answered, of one reply channel's owner."""

    def __init__(self, transport: Transport, fail: Fail, grace_s: float = GRACE_S, watch_s: float = WATCH_S,
                 relook_s: float = RELOOK_S, clock: Callable[[], float] = time.monotonic,
                 unanswered: Unanswered | None = None, horizon_s: float | None = None) -> None:
        self._transport = transport if isinstance(transport, Holding) else None
        self._fail = fail
        self._grace_s = grace_s
        self._watch_s = watch_s
        self._relook_s = relook_s
        self._clock = clock
        self._unanswered = unanswered or _recorded
        self._horizon_s = horizon_s
        self._sent: dict[str, Sent] = {}  # oldest first
        self._looked_at = 0  # the transport's failures when the ledger last looked
        self._relook_at: float | None = None  # when to look once more, on the ledger's clock
        # Requests found lost, by (model, "sent_again" or "failed"), for /metrics.
        self.counts: Counter[tuple[str, str]] = Counter()
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._transport is not None and self._watch is None:
            self._looked_at = self._transport.failures
            self._watch = asyncio.create_task(self._watching(self._transport), name="lost-requests")

    async def aclose(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
            self._watch = None
        self._sent.clear()

    def record(self, request_id: str, channel: str, message_id: str, model: str,
               resend: Resend | None) -> None:
        if self._transport is None:
            return
        now = self._clock()
        self._sent.pop(request_id, None)
        self._sent[request_id] = Sent(channel, message_id, model, resend, now)
        if self._horizon_s is not None:
            cutoff = now - self._horizon_s
            for old_id in list(itertools.takewhile(lambda rid: self._sent[rid].at < cutoff, self._sent)):
                del self._sent[old_id]

    def forget(self, request_id: str) -> None:
        """Its first reply came, or its caller stopped waiting."""
        self._sent.pop(request_id, None)

    async def _watching(self, transport: Holding) -> None:
        while True:
            await asyncio.sleep(self._watch_s)
            failures = transport.failures
            relook = self._relook_at is not None and self._clock() >= self._relook_at
            if failures == self._looked_at and not relook:
                continue
            if not self._sent:  # nothing awaits a reply: nothing can have been lost
                if failures != self._looked_at:
                    log.info("lost_requests.none_unanswered", failures=failures)
                self._looked_at, self._relook_at = failures, None
                continue
            try:
                await self._look(transport, self._clock())
            except BrokerError as exc:  # still failing: look again next round
                log.info("lost_requests.look_failed", error=str(exc))
                continue
            except Exception:  # a task of its own: say so rather than leave it to asyncio's "never retrieved"
                log.exception("lost_requests.look_crashed")
            self._relook_at = None if relook and failures == self._looked_at else self._clock() + self._relook_s
            self._looked_at = failures

    async def _look(self, transport: Holding, now: float) -> None:
        missing = await self._missing(transport, now)
        if not missing:
            log.info("lost_requests.none_missing", unanswered=len(self._sent))
            return
        log.info("lost_requests.missing", count=len(missing), grace_s=self._grace_s)
        await asyncio.sleep(self._grace_s)
        for request_id in await self._unanswered(missing):
            await self._settle(request_id, now)

    async def _missing(self, transport: Holding, now: float) -> list[str]:
        """Request ids sent before ``now``, not in their channels, and unanswered."""
        by_channel: dict[str, list[tuple[str, str]]] = {}
        for request_id, sent in self._sent.items():
            if sent.at < now:
                by_channel.setdefault(sent.channel, []).append((request_id, sent.message_id))
        missing: list[str] = []
        for channel, pairs in by_channel.items():
            for start in range(0, len(pairs), CHUNK):
                chunk = pairs[start:start + CHUNK]
                held = await transport.holds(channel, [message_id for _, message_id in chunk])
                missing += [request_id for (request_id, _), there in zip(chunk, held) if not there]
        return await self._unanswered(missing) if missing else []

    async def _settle(self, request_id: str, looked_at: float) -> None:
        sent = self._sent.get(request_id)
        if sent is None or sent.at >= looked_at:  # answered meanwhile, or already sent again
            return
        if sent.resend is None:
            await self._give_up(request_id, sent, "it may or may not have been applied: sending it again is not safe")
            return
        try:
            message_id = await sent.resend()
        except BrokerError as exc:
            await self._give_up(request_id, sent, f"sending it again failed: {exc}")
            return
        log.warning("lost_requests.sent_again", request_id=request_id, channel=sent.channel,
                    lost_id=sent.message_id, message_id=message_id)
        self.counts[sent.model, "sent_again"] += 1
        if self._sent.pop(request_id, None) is not None:  # not answered while it was being sent
            self._sent[request_id] = Sent(sent.channel, message_id, sent.model, sent.resend, self._clock())

    async def _give_up(self, request_id: str, sent: Sent, why: str) -> None:
        self._sent.pop(request_id, None)
        log.warning("lost_requests.failed", request_id=request_id, channel=sent.channel, lost_id=sent.message_id)
        self.counts[sent.model, "failed"] += 1
        message = (f"the broker lost request {request_id} (message {sent.message_id} of '{sent.channel}') "
                   f"in a failure; {why}")
        await self._fail(Response(id=request_id, model=sent.model, error=ErrorInfo("unavailable", message)))


async def _recorded(request_ids: list[str]) -> list[str]:
    """Where the owner sees every reply, a request still recorded is unanswered."""
    return request_ids
