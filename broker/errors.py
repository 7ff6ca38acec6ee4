"""Errors raised by ferry's broker layer.

    BrokerError
     ├── EnvelopeError     bytes that are not a valid envelope
     ├── TransportClosed   the transport was used after aclose()
     ├── TransportError    the transport's backing service failed
     ├── MessageTooLarge   the broker refused a message for its size (Kafka's max.message.bytes)
     └── ClaimMissing      a claim-checked tensor's bytes are gone (expired, or never there)

Foreign exceptions (redis, kafka) are translated into these at the edge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


class BrokerError(Exception):
    pass


class EnvelopeError(BrokerError):
    pass


class TransportClosed(BrokerError):
    pass


class TransportError(BrokerError):
    pass


class MessageTooLarge(BrokerError):
    pass


class ClaimMissing(BrokerError):
    pass


@contextmanager
def translated(foreign: type[BaseException] | tuple[type[BaseException], ...], service: str,
               closed: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """Re-raise ``foreign`` errors of a client library as TransportClosed (when
    ``closed()``) or TransportError naming ``service``."""
    try:
        yield
    except foreign as exc:
        if closed():
            raise TransportClosed(f"{service} transport is closed") from exc
        raise TransportError(f"{service}: {str(exc) or repr(exc)}") from exc
