"""How request messages are read and replies written: the worker's format seam.

The worker hands each delivery to a ``MessageFormat``: ``decode`` turns it
into a ``Request`` (or raises ``EnvelopeError``), and ``reply`` says what to
publish back, and where, for a response, including for a message that could
not be decoded (None when no reply channel can be read from it).

``EnvelopeFormat`` reads only ferry's msgpack envelope. ``v2_json.V2MessageFormat``
also reads KServe V2 JSON bodies, for messages that external producers put
straight onto a topic or stream.

Every reply carries headers naming what it answers, so a client reading a
shared reply topic can match it without decoding the body:
``content-type``, ``request-id``, ``model`` and, on errors, ``error`` (the
error code).

A request without a trace context of its own takes the ``traceparent`` and
``tracestate`` headers of its message, so a producer outside ferry (kcat)
can start the trace.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from broker.envelope import Request, Response, decode_request, encode_response, peek_reply_to
from broker.transport import Delivery, Headers

MSGPACK = "application/x-msgpack"
JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Outgoing:
    channel: str
    payload: bytes
    key: str | None = None
    headers: Headers = ()


class MessageFormat(Protocol):
    def decode(self, delivery: Delivery, model: str) -> Request:
        """The request in ``delivery``, read from ``model``'s channel; raises EnvelopeError."""

    def reply(self, delivery: Delivery, request: Request | None, response: Response) -> Outgoing | None:
        """What to publish for ``response``; ``request`` is None when decoding failed."""


def reply_headers(response: Response, content_type: str) -> Headers:
    headers: list[tuple[str, bytes]] = [
        ("content-type", content_type.encode()),
        ("request-id", response.id.encode()),
        ("model", response.model.encode()),
    ]
    if response.error is not None:
        headers.append(("error", response.error.code.encode()))
    return tuple(headers)


TRACE_HEADERS = ("traceparent", "tracestate")


def header_trace(delivery: Delivery) -> dict[str, str]:
    """The W3C trace context a producer put in the message's headers (a Kafka
    header, or a Redis entry's ``h.traceparent`` field)."""
    found = {name: delivery.header(name) for name in TRACE_HEADERS}
    return {name: value.decode(errors="replace").strip() for name, value in found.items() if value}


def with_header_trace(request: Request, delivery: Delivery) -> Request:
    """The envelope's own trace context wins; without one, the headers' is used."""
    if request.trace.get("traceparent") or not delivery.headers:
        return request
    trace = header_trace(delivery)
    return replace(request, trace=trace) if trace else request


class EnvelopeFormat:
    def decode(self, delivery: Delivery, model: str) -> Request:
        return with_header_trace(decode_request(delivery.payload), delivery)

    def reply(self, delivery: Delivery, request: Request | None, response: Response) -> Outgoing | None:
        if request is None:
            target = peek_reply_to(delivery.payload)
            if target is None:
                return None
            request_id, reply_to = target
            response = response.with_id(request_id)
        else:
            reply_to = request.reply_to
        return Outgoing(reply_to, encode_response(response), response.id, reply_headers(response, MSGPACK))
