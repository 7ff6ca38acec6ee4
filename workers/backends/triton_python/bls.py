"""Business logic scripting: a Python model's own requests to other models.

``pb_utils.InferenceRequest(...).exec()`` runs on the model's thread; it asks
the ``ModelCaller`` installed in this process. In a worker that is
``BrokerModelCaller``: the request goes onto the callee's request channel and
the answer comes back on the worker's step reply channel (the one ensembles
use), so each callee is computed by whichever worker serves it and scales on
its own. In an instance process (``python_stub``) it is a frame to the worker,
which makes the same call (``StubModelCaller``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from broker import channels
from broker.request_ids import new_request_id
from broker.envelope import (
    ErrorInfo, ParamValue, Request, Response, WireTensor, decode_response, encode_request,
)
from workers.backends.python_wire import Channel
from workers.datatypes import decode_array, encode_array
from workers.ensemble.broker_caller import BrokerStepCaller
from workers.errors import WorkerError
from workers.repository.config import ModelConfig
from workers.backends.triton_python import pb_utils

DEFAULT_TIMEOUT_S = 300.0
UNROUTED = "ferry.replies.unrouted"  # the step caller sends it with its own reply channel instead


class ModelCaller(Protocol):
    def call(self, request: Request) -> Response:
        """``request``'s reply (its error included); blocks the calling thread until it comes."""
        ...


_lock = threading.Lock()
_current: ModelCaller | None = None


def install(caller: ModelCaller | None) -> None:
    global _current
    with _lock:
        _current = caller


def current() -> ModelCaller:
    with _lock:
        caller = _current
    if caller is None:
        raise pb_utils.TritonModelException("no model can be called from here: business logic scripting needs a "
                                            "ferry worker")
    return caller


def infer(model: str, version: int, inputs: Sequence[pb_utils.Tensor], outputs: Sequence[str],
          parameters: dict[str, Any], timeout_us: int) -> pb_utils.InferenceResponse:
    """A model's own request, answered by whichever worker serves ``model``."""
    return answer(current().call(envelope(model, version, inputs, outputs, parameters, timeout_us, time.time_ns())))


def envelope(model: str, version: int, inputs: Sequence[pb_utils.Tensor], outputs: Sequence[str],
             parameters: dict[str, Any], timeout_us: int, now_ns: int) -> Request:
    """The request message for a model's own request."""
    wire = []
    for tensor in inputs:
        array = tensor.as_numpy()
        datatype, data = encode_array(array)
        # A copy: the model may change its array while its request is still on the way (async_exec).
        wire.append(WireTensor(tensor.name(), datatype, tuple(array.shape), bytes(data)))
    kept: dict[str, ParamValue] = {k: v for k, v in parameters.items() if isinstance(v, (str, int, float, bool))}
    return Request(id=new_request_id(), model=model, model_version=str(version) if version > 0 else "",
                   inputs=tuple(wire), reply_to=UNROUTED, outputs=tuple(outputs), parameters=kept,
                   timeout_us=timeout_us, deadline_ns=now_ns + timeout_us * 1000 if timeout_us else 0,
                   created_ns=now_ns)


def answer(response: Response) -> pb_utils.InferenceResponse:
    """A reply message as the model sees it: its outputs, or its error."""
    if response.error is not None:
        code = pb_utils.TritonError.INVALID_ARG if response.error.code == "invalid_argument" else \
            pb_utils.TritonError.NOT_FOUND if response.error.code == "not_found" else pb_utils.TritonError.INTERNAL
        return pb_utils.InferenceResponse([], error=pb_utils.TritonError(response.error.message, code))
    tensors = [pb_utils.Tensor(t.name, decode_array(t.name, t.datatype, t.shape, t.data)) for t in response.outputs]
    return pb_utils.InferenceResponse(tensors)


class BrokerModelCaller:
    """Calls from model threads, made on the worker's event loop through its step caller."""

    def __init__(self, steps: BrokerStepCaller, config_of: Callable[[str], ModelConfig],
                 loop: asyncio.AbstractEventLoop, prefix: str = channels.PREFIX) -> None:
        self._steps = steps
        self._config_of = config_of
        self._loop = loop
        self._prefix = prefix

    def call(self, request: Request) -> Response:
        """``request``'s reply, from any thread but the event loop's."""
        return asyncio.run_coroutine_threadsafe(self.call_async(request), self._loop).result()

    async def call_async(self, request: Request) -> Response:
        try:
            level = self._config_of(request.model).priority_level(0)
        except WorkerError as exc:
            return Response(id=request.id, model=request.model, error=_error(exc))
        await self._steps.start()
        timeout_s = request.timeout_us / 1e6 if request.timeout_us else DEFAULT_TIMEOUT_S
        try:
            return await self._steps.call(channels.request_channel(request.model, self._prefix, level), request,
                                          timeout_s)
        except WorkerError as exc:
            return Response(id=request.id, model=request.model, error=_error(exc))


def _error(exc: WorkerError) -> ErrorInfo:
    return ErrorInfo(exc.code, str(exc))


class StubModelCaller:
    """In an instance process: each call a frame to the worker, which makes it (``python_process``)
    and sends the reply back. One at a time: the instance's socket carries one exchange at once."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._lock = threading.Lock()

    def call(self, request: Request) -> Response:
        with self._lock:
            self._channel.send({"bls": encode_request(request)})
            header, _ = self._channel.receive()
        return decode_response(header["bls"])
