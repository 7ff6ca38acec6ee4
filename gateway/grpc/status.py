"""ferry's errors as gRPC status codes, the way Triton maps its own.

An error is first given its HTTP status (``gateway.status``, the one place
that classifies them), then the gRPC code Triton uses for that class:
invalid argument, not found, unavailable, unimplemented and so on. Anything
unexpected is logged with its traceback and leaves as INTERNAL.
"""

from __future__ import annotations

from typing import NoReturn

import grpc
import structlog

from broker.envelope import ErrorInfo
from gateway.errors import AlreadyExists
from gateway.status import ANSWERED, status_for, status_for_code

log = structlog.get_logger("ferry.gateway.grpc")

_BY_HTTP = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    410: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_code(http_status: int) -> grpc.StatusCode:
    return _BY_HTTP.get(http_status, grpc.StatusCode.UNKNOWN)


def _code_for(error: Exception) -> grpc.StatusCode:
    # Triton's HTTP door folds ALREADY_EXISTS into 400; its gRPC door keeps the code.
    return grpc.StatusCode.ALREADY_EXISTS if isinstance(error, AlreadyExists) else grpc_code(status_for(error))


async def abort_with(context: grpc.aio.ServicerContext, error: Exception | ErrorInfo) -> NoReturn:
    """End the call with ``error``'s status and message (raises, as ``context.abort`` does)."""
    if isinstance(error, ErrorInfo):
        await context.abort(grpc_code(status_for_code(error.code)), error.message)
    if isinstance(error, ANSWERED):
        await context.abort(_code_for(error), str(error))
    log.error("grpc.unhandled", error=f"{type(error).__name__}: {error}", exc_info=error)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}: {error}")
    raise AssertionError("context.abort returned")  # for the type checker: abort always raises
