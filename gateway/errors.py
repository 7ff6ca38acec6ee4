"""Errors raised by ferry's gateway.

    GatewayError
     ├── InvalidRequest    the client's request is malformed or inconsistent
     ├── PayloadTooLarge   the request body exceeds the configured limit
     ├── UnsupportedEncoding  the request body's Content-Encoding is not one ferry takes
     ├── ModelUnavailable  the model exists but no worker serves it yet
 │    └── QueueFull     the model's queue holds max_queue_size requests
     ├── UpstreamTimeout   no reply arrived from the workers in time
     ├── JobNotFound       no async job has this id
     ├── JobConflict       the async job is past the state the request needs
     ├── RegionNotFound    no shared memory region has this name (a status lookup)
     ├── FeatureDisabled   the server was started without the feature (client shared memory)
     └── ClientDisconnected  the client hung up before its request body arrived

The classes carry meaning only; ``gateway.status`` maps them to HTTP codes.
"""

from __future__ import annotations


class GatewayError(Exception):
    pass


class InvalidRequest(GatewayError):
    pass


class AlreadyExists(InvalidRequest):
    """A name is taken (a shared memory region registered twice): a 400 over HTTP, as in
    Triton, and ALREADY_EXISTS over gRPC."""


class PayloadTooLarge(GatewayError):
    pass


class UnsupportedEncoding(GatewayError):
    """The body's Content-Encoding is not one ferry takes; ``accepted`` lists those it does."""

    def __init__(self, message: str, accepted: str) -> None:
        super().__init__(message)
        self.accepted = accepted


class ModelUnavailable(GatewayError):
    """The model exists but no worker serves it yet."""


class QueueFull(ModelUnavailable):
    """The model's queue is full; the client may retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UpstreamTimeout(GatewayError):
    """No reply arrived from the workers in time."""


class JobNotFound(GatewayError):
    """No job has this id (or it expired and was forgotten)."""


class JobConflict(GatewayError):
    """The job is past the state the request needs (cancelling a finished job)."""


class RegionNotFound(GatewayError):
    """No shared memory region is registered under this name."""


class FeatureDisabled(GatewayError):
    """The server was not started with this feature (Triton answers 501)."""


class ClientDisconnected(GatewayError):
    """The client hung up (or was timed out) while its request body was read;
    no one is left to answer."""
