"""Errors raised by ferry's gateway.

    GatewayError
     ├── InvalidRequest    the client's request is malformed or inconsistent
     └── PayloadTooLarge   the request body exceeds the configured limit

The classes carry meaning only; ``gateway.status`` maps them to HTTP codes.
"""

from __future__ import annotations


class GatewayError(Exception):
    pass


class InvalidRequest(GatewayError):
    pass


class PayloadTooLarge(GatewayError):
    pass


class ModelUnavailable(GatewayError):
    """The model exists but no worker serves it yet."""


class UpstreamTimeout(GatewayError):
    """No reply arrived from the workers in time."""
