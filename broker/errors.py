"""Errors raised by ferry's broker layer.

    BrokerError
     ├── EnvelopeError     bytes that are not a valid envelope
     ├── TransportClosed   the transport was used after aclose()
     └── TransportError    the transport's backing service failed

Foreign exceptions (redis, kafka) are translated into these at the edge.
"""

from __future__ import annotations


class BrokerError(Exception):
    pass


class EnvelopeError(BrokerError):
    pass


class TransportClosed(BrokerError):
    pass


class TransportError(BrokerError):
    pass
