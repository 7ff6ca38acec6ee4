"""Request messages as external producers write them: a KServe V2 JSON body
or ferry's msgpack envelope, told apart by the ``content-type`` header.

A V2 JSON message (``content-type: application/json``) is the body of
``POST /v2/models/{m}/infer``, optionally with binary tensor data after it
(header ``inference-header-content-length``, as over HTTP). What the HTTP path
would carry, headers carry:

    model           the model (default: the one whose topic it is on)
    model-version   a version (default: the latest)
    reply-to        the channel for the reply (required)
    request-id      the request id (default: the Kafka key, then the body's "id")
    deadline-ms     an absolute deadline, Unix epoch milliseconds
    traceparent     the W3C trace context to trace it under (and tracestate)

Its reply is a V2 JSON response body with tensors as ``data`` arrays; an
error reply is ``{"error": "..."}`` with the error code in an ``error``
header. A message with ``content-type: application/x-msgpack`` or none is an
envelope and is answered in kind, as ``EnvelopeFormat`` does.

The body is read by the gateway's own V2 parser (``gateway.v2_codec``), so a
message on a topic means exactly what the same body means over HTTP; this is
the one module of ``workers`` that reads from ``gateway``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from broker.envelope import Request, Response
from broker.errors import EnvelopeError
from broker.transport import Delivery
from gateway.errors import GatewayError
from gateway.service import build_request
from gateway.v2_codec import RequestedOutput, parse_infer_request, render_error, render_infer_response
from workers.decimal_text import ascii_int
from workers.formats.envelope import JSON, MSGPACK, EnvelopeFormat, Outgoing, header_trace, reply_headers

KAFKA_KEY = "kafka-key"
_MAX_DEADLINE_MS = (2**63 - 1) // 1_000_000


class V2MessageFormat(EnvelopeFormat):
    def __init__(self, wall_ns: Callable[[], int] = time.time_ns) -> None:
        self._wall_ns = wall_ns

    def decode(self, delivery: Delivery, model: str) -> Request:
        kind = _content_type(delivery)
        if kind == MSGPACK:
            return super().decode(delivery, model)
        if kind != JSON:
            raise EnvelopeError(f"unsupported content-type '{kind}': expected {JSON} or {MSGPACK}")
        reply_to = _text(delivery, "reply-to")
        if not reply_to:
            raise EnvelopeError("a JSON request needs a 'reply-to' header")
        try:
            parsed = parse_infer_request(delivery.payload, _header_length(delivery))
            request_id = _text(delivery, "request-id") or _text(delivery, KAFKA_KEY) or parsed.id
            if not request_id:
                raise EnvelopeError("a JSON request needs a 'request-id' header, a Kafka key or an 'id'")
            now = self._wall_ns()
            request = build_request(parsed, _text(delivery, "model") or model,
                                    _text(delivery, "model-version"), reply_to, request_id, now,
                                    header_trace(delivery))
        except GatewayError as exc:
            raise EnvelopeError(str(exc)) from None
        deadline_ms = _text(delivery, "deadline-ms")
        if deadline_ms:
            request = replace(request, deadline_ns=_deadline_ns(deadline_ms))
        return request

    def reply(self, delivery: Delivery, request: Request | None, response: Response) -> Outgoing | None:
        kind = _content_type(delivery)
        if kind == MSGPACK:
            return super().reply(delivery, request, response)
        reply_to = request.reply_to if request is not None else _text(delivery, "reply-to")
        if not reply_to:
            return None
        if request is None:
            response = response.with_id(_text(delivery, "request-id") or _text(delivery, KAFKA_KEY))
        headers = reply_headers(response, JSON)
        if response.error is not None:
            return Outgoing(reply_to, render_error(response.error.message), response.id or None, headers)
        requested = tuple(RequestedOutput(name, False) for name in request.outputs) if request else ()
        payload, _ = render_infer_response(response, requested, binary_default=False)
        return Outgoing(reply_to, payload, response.id, headers)


def _content_type(delivery: Delivery) -> str:
    raw = delivery.header("content-type")
    if raw is None:
        return MSGPACK
    return raw.decode(errors="replace").split(";", 1)[0].strip().lower()


def _text(delivery: Delivery, name: str) -> str:
    raw = delivery.header(name)
    return "" if raw is None else raw.decode(errors="replace").strip()


def _header_length(delivery: Delivery) -> int | None:
    raw = _text(delivery, "inference-header-content-length")
    if not raw:
        return None
    length = ascii_int(raw)
    if length is None:
        raise EnvelopeError(f"header 'inference-header-content-length' must be an integer, got '{raw}'")
    return length


def _deadline_ns(text: str) -> int:
    # The envelope carries deadline_ns as an int64, so the deadline must come before 2262.
    deadline_ms = ascii_int(text, 13)
    if deadline_ms is None or deadline_ms > _MAX_DEADLINE_MS:
        raise EnvelopeError(f"header 'deadline-ms' must be Unix epoch milliseconds, got '{text}'")
    return deadline_ms * 1_000_000
