"""Where a request goes when it will not be computed: an error reply to its
sender when a reply channel can be read from it, and the dead-letter channel
when it is not a request at all or has been tried too often.

A dead letter is a msgpack map naming the channel and message id it came
from, how often it was delivered, why it was given up, and the original
bytes, so an operator can inspect or replay it.
"""

from __future__ import annotations

import msgpack
import structlog

from broker import channels
from broker.envelope import ErrorInfo, Response
from broker.transport import Delivery, Transport
from workers.formats import EnvelopeFormat, MessageFormat

log = structlog.get_logger("ferry.worker")


def encode_dead_letter(delivery: Delivery, reason: str) -> bytes:
    return msgpack.packb({
        "v": 1,
        "kind": "dead_letter",
        "channel": delivery.channel,
        "message_id": delivery.message_id,
        "attempts": delivery.attempts,
        "reason": reason,
        "payload": delivery.payload,
    }, use_bin_type=True)


class DeadLetters:
    def __init__(self, transport: Transport, prefix: str = channels.PREFIX,
                 message_format: MessageFormat = EnvelopeFormat()) -> None:
        self._transport = transport
        self._format = message_format
        self.channel = channels.dead_letter_channel(prefix)

    async def reject(self, delivery: Delivery, reason: str) -> None:
        """Bytes that are not a valid request: answer if we can, else dead-letter."""
        answered = await self._answer(delivery, ErrorInfo("invalid_argument", f"malformed request: {reason}"))
        if not answered:
            await self._transport.publish(self.channel, encode_dead_letter(delivery, reason))
        log.warning("worker.bad_message", channel=delivery.channel, message_id=delivery.message_id,
                    reason=reason, answered=answered)

    async def give_up(self, delivery: Delivery, reason: str, error: ErrorInfo) -> None:
        """A request tried too often: dead-letter it and tell its sender ``error``."""
        await self._transport.publish(self.channel, encode_dead_letter(delivery, reason))
        answered = await self._answer(delivery, error)
        log.warning("worker.dead_lettered", channel=delivery.channel, message_id=delivery.message_id,
                    reason=reason, answered=answered)

    async def _answer(self, delivery: Delivery, error: ErrorInfo) -> bool:
        reply = self._format.reply(delivery, None, Response(id="", model="", error=error))
        if reply is None:
            return False
        await self._transport.publish(reply.channel, reply.payload, key=reply.key, headers=reply.headers)
        return True
