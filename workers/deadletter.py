"""Where a request goes when it will not be computed: an error reply to its
sender when a reply channel can be read from it, and the dead-letter channel
when it is not a request at all or has been tried too often.

A dead letter is a msgpack map naming the channel and message id it came
from, how often it was delivered, why it was given up, and the original
bytes, so an operator can inspect or replay it.

Nothing in ferry reads the dead-letter channel, so it is bounded on every
broker (``DeadLetterSettings``): it keeps the newest ``max_count`` letters
(``Transport.cap`` after each write), and each letter holds at most its equal
share of ``max_bytes``, so the letters never add up to more than
``max_bytes``. A payload longer than its share keeps its first bytes, and the
letter records ``truncated``, the original length and its SHA-256 digest:
enough to recognise the message, though no longer to replay it. Both losses
are counted by the observer (``/metrics``) and logged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgpack
import structlog

from broker import channels
from broker.envelope import ErrorInfo, Response
from broker.errors import TransportError
from broker.transport import Delivery, Transport
from workers.formats.envelope import EnvelopeFormat, MessageFormat
from workers.telemetry import NO_OBSERVER, DeadLetterRecord, Observer

log = structlog.get_logger("ferry.worker")

MIB = 1 << 20
# The reason is the only other field that can grow (a model's error message).
MAX_REASON_BYTES = 1024
# Room for every field but the payload, the reason at its longest included.
MIN_LETTER_BYTES = 4096
# msgpack's header for a bin of up to 4 GiB, less the empty one it replaces.
_BIN_HEADER_GROWTH = 5 - 2


@dataclass(frozen=True, slots=True)
class DeadLetterSettings:
    max_count: int = 1024  # letters the channel keeps, the newest
    max_bytes: int = 64 * MIB  # what they may add up to: each letter holds at most max_bytes / max_count

    def __post_init__(self) -> None:
        if self.max_count < 1:
            raise ValueError(f"the dead-letter count bound must be at least 1, got {self.max_count}")
        if self.letter_bytes < MIN_LETTER_BYTES:
            raise ValueError(
                f"a dead-letter byte bound of {self.max_bytes} leaves {self.letter_bytes} bytes for each of "
                f"{self.max_count} letters; each needs at least {MIN_LETTER_BYTES}"
            )

    @property
    def letter_bytes(self) -> int:
        return self.max_bytes // self.max_count


def encode_dead_letter(delivery: Delivery, reason: str, max_bytes: int) -> tuple[bytes, int]:
    """The letter, at most ``max_bytes`` long, and how many payload bytes it kept."""
    payload = delivery.payload
    letter: dict[str, Any] = {
        "v": 1,
        "kind": "dead_letter",
        "channel": delivery.channel,
        "message_id": delivery.message_id,
        "attempts": delivery.attempts,
        "reason": _clip(reason, MAX_REASON_BYTES),
        "payload_bytes": len(payload),
        "truncated": False,
        "payload": b"",
    }
    if len(_pack(letter)) + _BIN_HEADER_GROWTH + len(payload) > max_bytes:
        letter.update(truncated=True, payload_sha256=hashlib.sha256(payload).hexdigest())
    room = max(0, max_bytes - len(_pack(letter)) - _BIN_HEADER_GROWTH)
    letter["payload"] = payload[:room]
    return _pack(letter), min(room, len(payload))


class DeadLetters:
    def __init__(self, transport: Transport, prefix: str = channels.PREFIX,
                 message_format: MessageFormat = EnvelopeFormat(),
                 settings: DeadLetterSettings = DeadLetterSettings(), observer: Observer = NO_OBSERVER) -> None:
        self._transport = transport
        self._format = message_format
        self._settings = settings
        self._observer = observer
        self.channel = channels.dead_letter_channel(prefix)

    async def reject(self, delivery: Delivery, reason: str) -> None:
        """Bytes that are not a valid request: answer if we can, else dead-letter."""
        answered = await self._answer(delivery, ErrorInfo("invalid_argument", f"malformed request: {reason}"))
        written = None if answered else await self._write(delivery, reason)
        log.warning("worker.bad_message", channel=delivery.channel, message_id=delivery.message_id,
                    reason=_clip(reason, MAX_REASON_BYTES), answered=answered, **_fields(written))

    async def give_up(self, delivery: Delivery, reason: str, error: ErrorInfo) -> None:
        """A request tried too often: dead-letter it and tell its sender ``error``."""
        written = await self._write(delivery, reason)
        answered = await self._answer(delivery, error)
        log.warning("worker.dead_lettered", channel=delivery.channel, message_id=delivery.message_id,
                    reason=_clip(reason, MAX_REASON_BYTES), answered=answered, **_fields(written))

    async def _write(self, delivery: Delivery, reason: str) -> DeadLetterRecord:
        letter, kept = encode_dead_letter(delivery, reason, self._settings.letter_bytes)
        await self._transport.publish(self.channel, letter)
        written = DeadLetterRecord(len(delivery.payload), kept, await self._cap())
        self._observer.dead_lettered(written)
        return written

    async def _cap(self) -> int:
        try:
            return await self._transport.cap(self.channel, self._settings.max_count)
        except TransportError as exc:
            # The letter is written; failing its delivery now would only write it again. The next letter caps.
            log.warning("worker.dead_letter_cap_failed", channel=self.channel, max_count=self._settings.max_count,
                        error=str(exc))
            return 0

    async def _answer(self, delivery: Delivery, error: ErrorInfo) -> bool:
        reply = self._format.reply(delivery, None, Response(id="", model="", error=error))
        if reply is None:
            return False
        await self._transport.publish(reply.channel, reply.payload, key=reply.key, headers=reply.headers)
        return True


def _fields(written: DeadLetterRecord | None) -> dict[str, Any]:
    """What a log line says about a letter: its size, what was cut, what it pushed out."""
    if written is None:
        return {}
    return {"payload_bytes": written.payload_bytes, "kept_bytes": written.kept_bytes,
            "truncated": written.truncated, "evicted": written.evicted}


def _clip(text: str, max_bytes: int) -> str:
    return text.encode()[:max_bytes].decode(errors="ignore")


def _pack(letter: dict[str, Any]) -> bytes:
    return msgpack.packb(letter, use_bin_type=True)
