"""ferry inside a Python program, without HTTP: Triton's in-process API counterpart.

    from ferry.api import Server

    with Server("model_repo") as server:
        outputs = server.infer("add_sub", {"INPUT0": a, "INPUT1": b})   # {"OUTPUT0": ..., ...}

    async with AsyncServer("model_repo") as server:
        outputs = await server.infer("add_sub", {...})
        async for outputs in server.infer_stream("countdown", {"N": n}):  # a decoupled model
            ...

Both run what ``ferry serve`` runs (``ferry.wiring.serve``): the embedded worker with
its dynamic batcher, behind the same inference service the HTTP and gRPC doors use,
so concurrent calls are batched together as HTTP requests are. With ``broker``
naming a Redis or Kafka fleet, the process joins it as ``ferry serve --broker``
does: its worker serves the fleet's requests too, and its calls may be answered by
any worker (``worker=False`` leaves the serving to the fleet).

Inputs are numpy arrays (or what ``np.asarray`` takes); strings travel as BYTES, and
BYTES outputs come back as object arrays of ``bytes``. A request the model or the
server refuses raises ``InferenceError``, whose ``status`` is the HTTP status the
same request would have had.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from broker.envelope import Response, WireTensor
from broker.redis_url import is_redis_url
from ferry.wiring.gateway import build_gateway_parts
from ferry.wiring.serve import Serving, build_serving
from ferry.wiring.settings import ServeSettings
from gateway.service import InferenceService, ServiceSettings
from gateway.statistics import Statistics
from gateway.status import ANSWERED, status_for, status_for_code
from gateway.v2_codec import ParsedInfer, RequestedOutput
from workers.datatypes import decode_array, encode_array
from workers.recovery import RecoverySettings
from workers.responder import FINAL_FLAG
from workers.worker import WorkerSettings

Tensors = dict[str, np.ndarray]


class InferenceError(Exception):
    """A request that was not answered with outputs: ``status`` is its HTTP status, ``code``
    the error's kind (``invalid_argument``, ``not_found``, ``unavailable``, ``internal``...)."""

    def __init__(self, message: str, status: int, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def settings_for(model_repository: str | Path, broker: str = "memory://") -> ServeSettings:
    """``ferry serve``'s defaults for ``broker``, without the HTTP and gRPC doors."""
    shared = broker != "memory://"
    return ServeSettings(
        model_repository=Path(model_repository), broker_url=broker,
        service=ServiceSettings(route_sequences=is_redis_url(broker)),
        worker=WorkerSettings(recovery=RecoverySettings(retry_failures=shared)))


class AsyncServer:
    def __init__(self, model_repository: str | Path, *, broker: str = "memory://",
                 settings: ServeSettings | None = None, worker: bool = True) -> None:
        self.settings = settings or settings_for(model_repository, broker)
        if not worker and self.settings.broker_url == "memory://":
            raise ValueError("worker=False needs a shared broker (redis://, redis+cluster:// or kafka://) "
                             "whose workers serve the models")
        self._worker = worker
        self._stack: contextlib.AsyncExitStack | None = None
        self._service: InferenceService | None = None
        self._statistics: Statistics | None = None

    async def start(self) -> None:
        if self._stack is not None:
            raise RuntimeError("the server is already started")
        stack = contextlib.AsyncExitStack()
        try:
            if self._worker:
                serving: Serving = build_serving(self.settings)
                await stack.enter_async_context(serving.running())
                self._service, self._statistics = serving.front.service, serving.front.statistics
            else:
                parts = build_gateway_parts(self.settings)
                await stack.enter_async_context(parts.running())
                self._service, self._statistics = parts.front.service, parts.front.statistics
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack

    async def stop(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def __aenter__(self) -> AsyncServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def is_ready(self, model: str = "") -> bool:
        catalog = self._started().catalog
        return catalog.is_ready(model) if model else catalog.all_ready()

    def models(self) -> list[dict[str, str]]:
        """The repository index: each model's name, version, state and reason."""
        return self._started().catalog.states()

    async def statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics (``{"model_stats": [...]}``), as ``/v2/models/.../stats`` gives them."""
        self._started()
        assert self._statistics is not None
        return await self._statistics.model_stats(model, version)

    async def infer(self, model: str, inputs: Mapping[str, Any], *, version: str = "",
                    outputs: Sequence[str] = (), parameters: Mapping[str, Any] | None = None,
                    request_id: str = "") -> Tensors:
        service = self._started()
        parsed = _parsed(inputs, outputs, parameters, request_id)
        try:
            response = await service.infer(model, version, parsed)
        except ANSWERED as exc:
            raise InferenceError(str(exc), status_for(exc)) from None
        return _outputs(response)

    async def infer_stream(self, model: str, inputs: Mapping[str, Any], *, version: str = "",
                           outputs: Sequence[str] = (), parameters: Mapping[str, Any] | None = None,
                           request_id: str = "") -> AsyncIterator[Tensors]:
        """Each response of a decoupled model as it comes (one for any other model)."""
        service = self._started()
        parsed = _parsed(inputs, outputs, parameters, request_id)
        try:
            replies = await service.stream(model, version, parsed)
            async for response in replies:
                if response.error is None and not response.outputs and response.parameters.get(FINAL_FLAG):
                    continue  # the empty final response that ends a stream
                yield _outputs(response)
        except ANSWERED as exc:
            raise InferenceError(str(exc), status_for(exc)) from None

    def _started(self) -> InferenceService:
        if self._service is None or self._stack is None:
            raise RuntimeError("the server is not started: use `async with AsyncServer(...)` or await start()")
        return self._service


class Server:
    """``AsyncServer`` for code without an event loop: it runs on a thread of its own."""

    def __init__(self, model_repository: str | Path, *, broker: str = "memory://",
                 settings: ServeSettings | None = None, worker: bool = True) -> None:
        self._server = AsyncServer(model_repository, broker=broker, settings=settings, worker=worker)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ferry-api", daemon=True)

    def start(self) -> None:
        self._thread.start()
        try:
            self._call(self._server.start())
        except BaseException:
            self._end_loop()
            raise

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self._call(self._server.stop())
        finally:
            self._end_loop()

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def is_ready(self, model: str = "") -> bool:
        return self._server.is_ready(model)

    def models(self) -> list[dict[str, str]]:
        return self._server.models()

    def statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        return self._call(self._server.statistics(model, version))

    def infer(self, model: str, inputs: Mapping[str, Any], **options: Any) -> Tensors:
        return self._call(self._server.infer(model, inputs, **options))

    def infer_stream(self, model: str, inputs: Mapping[str, Any], **options: Any) -> Iterator[Tensors]:
        handed: queue.Queue[tuple[str, Any]] = queue.Queue()

        async def pump() -> None:
            try:
                async for outputs in self._server.infer_stream(model, inputs, **options):
                    handed.put(("outputs", outputs))
            except BaseException as exc:
                handed.put(("error", exc))
            else:
                handed.put(("end", None))

        asyncio.run_coroutine_threadsafe(pump(), self._loop)
        while True:
            kind, value = handed.get()
            if kind == "outputs":
                yield value
            elif kind == "error":
                raise value
            else:
                return

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _end_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _parsed(inputs: Mapping[str, Any], outputs: Sequence[str], parameters: Mapping[str, Any] | None,
            request_id: str) -> ParsedInfer:
    tensors = []
    for name, value in inputs.items():
        array = np.asarray(value)
        if array.dtype.kind in "US":
            array = array.astype(object)
        datatype, data = encode_array(array)
        # A copy: the caller's arrays are theirs to change once this returns, a job's request included.
        tensors.append(WireTensor(name, datatype, tuple(array.shape), bytes(data)))
    return ParsedInfer(id=request_id, inputs=tuple(tensors),
                       outputs=tuple(RequestedOutput(name, binary=True) for name in outputs),
                       parameters=dict(parameters or {}), binary_output_default=True)


def _outputs(response: Response) -> Tensors:
    if response.error is not None:
        raise InferenceError(response.error.message, status_for_code(response.error.code), response.error.code)
    return {t.name: decode_array(t.name, t.datatype, t.shape, t.data) for t in response.outputs}


__all__ = ["AsyncServer", "InferenceError", "Server", "settings_for"]
