"""The gRPC door's lifecycle: grpcio's asyncio server on ``--grpc-port``.

Several HTTP processes of one ``ferry serve`` (``--http-workers``) each run
one, sharing the port through ``SO_REUSEPORT`` as their HTTP servers do;
otherwise the port is this process's alone, and a port already taken fails
the start, as it does for Triton. Port 0 takes any free port (the log says
which).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import structlog
from tritonclient.grpc import service_pb2_grpc

from gateway.grpc.servicer import GrpcParts, InferenceServicer

log = structlog.get_logger("ferry.gateway.grpc")

GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class GrpcSettings:
    enabled: bool = False  # the command line turns it on (--allow-grpc, default true)
    host: str = "0.0.0.0"
    port: int = 8001
    shared_port: bool = False  # one of several HTTP processes on the same port
    max_message_bytes: int = 64 * 1024 * 1024


class GrpcError(RuntimeError):
    """The gRPC server could not start (its port is taken, say)."""


class GrpcServer:
    def __init__(self, parts: GrpcParts, settings: GrpcSettings) -> None:
        self._parts = parts
        self._settings = settings
        self._server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        settings = self._settings
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_message_bytes),
            ("grpc.so_reuseport", 1 if settings.shared_port else 0),
        ])
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(self._parts), server)
        address = f"{settings.host}:{settings.port}"
        try:
            self.port = server.add_insecure_port(address)
        except RuntimeError as exc:  # grpcio raises when it cannot bind
            raise GrpcError(f"cannot serve gRPC on {address}: {exc}") from None
        await server.start()
        self._server = server
        log.info("grpc.listening", host=settings.host, port=self.port)

    async def aclose(self) -> None:
        if self._server is not None:
            await self._server.stop(GRACE_S)
            self._server = None
