"""How a delivery is settled: its reply published and then acked, forwarded,
released for another try, or dead-lettered.

A delivery is acked only after its reply is published, so a worker that dies
mid-batch leaves it pending for another to claim.
"""

from __future__ import annotations

import structlog

from broker.claims.check import Claims, NoClaims
from broker.envelope import ErrorInfo, Request, Response
from broker.errors import BrokerError, MessageTooLarge, TransportError
from broker.transport import Delivery, Reclaiming, Transport
from workers.deadletter import DeadLetters
from workers.formats.envelope import MessageFormat
from workers.recovery import RETRIABLE_CODES, RecoverySettings, dead_letter_reason, exhausted, exhausted_error
from workers.telemetry import Timeline
from workers.telemetry.timeline import RELEASED

log = structlog.get_logger("ferry.worker")


class Replier:
    def __init__(self, transport: Transport, message_format: MessageFormat, dead_letters: DeadLetters,
                 recovery: RecoverySettings, claims: Claims = NoClaims()) -> None:
        self._transport = transport
        self._format = message_format
        self._dead_letters = dead_letters
        self._recovery = recovery
        self._claims = claims

    async def ack(self, delivery: Delivery) -> None:
        await self._transport.ack(delivery)

    async def reply(self, model: str, delivery: Delivery, request: Request, response: Response,
                    ack: bool = True) -> None:
        try:
            response = await self._claims.stash_response(response, request)
            try:
                await self._publish(delivery, request, response, ack)
            except MessageTooLarge as exc:
                # The answer cannot cross the broker whole: its sender is told so, in a reply that can.
                log.warning("worker.reply_too_large", model=model, request_id=request.id, error=str(exc))
                await self._publish(delivery, request, Response(
                    id=response.id, model=response.model, model_version=response.model_version,
                    error=ErrorInfo("internal", f"the reply could not be sent: {exc}"),
                    parameters=response.parameters, final=response.final), ack)
        except TransportError as exc:
            # Left unacked, so it is claimed and computed again once idle (the broker may be back by then).
            log.warning("worker.reply_failed", model=model, request_id=request.id, message_id=delivery.message_id,
                        error=str(exc), retry_after_s=self._recovery.idle_s)
            return
        if ack:
            await self._release(request)

    async def _publish(self, delivery: Delivery, request: Request, response: Response, ack: bool) -> None:
        """The reply, if it has somewhere to go, and with ``ack`` the delivery acked once it is sent."""
        reply = self._format.reply(delivery, request, response)
        if reply is None:
            if ack:
                await self._transport.ack(delivery)
        elif ack:
            await self._transport.reply(reply.channel, reply.payload, delivery, key=reply.key, headers=reply.headers)
        else:
            await self._transport.publish(reply.channel, reply.payload, key=reply.key, headers=reply.headers)

    async def _release(self, request: Request) -> None:
        """Answered and acked: its claim-checked inputs are needed no more (a TTL removes them if this fails)."""
        try:
            await self._claims.release(request)
        except BrokerError as exc:
            log.warning("worker.claims_not_released", request_id=request.id, error=str(exc))

    async def forward(self, delivery: Delivery, channel: str) -> None:
        try:
            await self._transport.publish(channel, delivery.payload, headers=delivery.headers)
            await self._transport.ack(delivery)
        except TransportError as exc:
            log.warning("worker.forward_failed", channel=channel, message_id=delivery.message_id, error=str(exc))

    async def give_up_if_exhausted(self, delivery: Delivery) -> bool:
        """True if ``delivery`` was tried too often, and is now dead-lettered and acked."""
        if not exhausted(delivery, self._recovery):
            return False
        await self._give_up(delivery)
        return True

    async def reject(self, delivery: Delivery, reason: str) -> None:
        """Bytes that are not a request: answered or dead-lettered, then acked."""
        await self._dead_letters.reject(delivery, reason)
        await self._transport.ack(delivery)

    async def retry_or_give_up(self, delivery: Delivery, error: ErrorInfo, timeline: Timeline) -> bool:
        """For a failed request: True if it was released for another try or
        dead-lettered (and answered), False if its error is the answer."""
        recovery = self._recovery
        if not recovery.retry_failures or error.code not in RETRIABLE_CODES:
            return False
        if delivery.attempts < recovery.max_deliveries and isinstance(self._transport, Reclaiming):
            await self._transport.release(delivery)
            timeline.outcome = RELEASED
            log.info("worker.released", channel=delivery.channel, message_id=delivery.message_id,
                     attempts=delivery.attempts, error=error.message)
            return True
        await self._give_up(delivery, error)
        return True

    async def _give_up(self, delivery: Delivery, error: ErrorInfo | None = None) -> None:
        await self._dead_letters.give_up(
            delivery, dead_letter_reason(delivery, error), exhausted_error(delivery, self._recovery, error)
        )
        await self._transport.ack(delivery)
