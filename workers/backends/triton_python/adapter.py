"""A ``TritonPythonModel`` behind ferry's backend seam.

``load`` calls ``initialize(args)`` with the keys Triton passes (``model_config``
as JSON, ``model_name``, ``model_version``, ``model_repository``,
``model_instance_kind``, ``model_instance_name``, ``model_instance_device_id``);
``unload`` calls ``finalize``. ``infer`` hands ``execute`` one request holding
the batch ferry's dynamic batcher formed (the requests' rows stacked along
dimension 0, as Triton's batching models must take them anyway) and returns the
one response's outputs. ``execute`` may be a coroutine, awaited on a loop of its
own so that ``async_exec`` calls run at once. A decoupled model gets one request
with a response sender; its responses stream out as it sends them, until the
final flag, even after ``execute`` has returned.

An error response, a ``TritonModelException`` or any exception from ``execute``
fails the request: with ``TritonError.INVALID_ARG`` as a 400, otherwise a 500
with the model's message.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import queue
from collections.abc import Iterator
from typing import Any

import numpy as np

from workers.backends.base import ModelContext
from workers.backends.triton_python import pb_utils
from workers.errors import ExecutionError, InvalidInput, ModelLoadError

CLASS_NAME = "TritonPythonModel"


class TritonPythonBackend:
    def __init__(self, context: ModelContext, model_class: type) -> None:
        self._context = context
        self._class = model_class
        self._model: Any = None
        self._who = f"model '{context.name}'"

    def load(self) -> None:
        config = self._context.config
        kind = config.instance_groups[0].kind if config.instance_groups else "KIND_CPU"
        args = {
            "model_config": json.dumps(config.to_json()),
            "model_instance_kind": "GPU" if kind == "KIND_GPU" else "CPU",
            "model_instance_name": f"{self._context.name}_{self._context.instance_index}",
            "model_instance_device_id": "0",
            "model_repository": str(self._context.version_dir.parent),
            "model_version": str(self._context.version),
            "model_name": self._context.name,
        }
        try:
            model = self._class()
            if hasattr(model, "initialize"):
                _run(model.initialize(args))
        except Exception as exc:
            raise ModelLoadError(f"{self._context.model_file}: initialize() failed: {exc!r}") from None
        self._model = model

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        responses = self._execute(self._request(inputs))
        if not isinstance(responses, (list, tuple)) or len(responses) != 1:
            count = len(responses) if isinstance(responses, (list, tuple)) else type(responses).__name__
            raise ExecutionError(f"{self._who}: execute() must return a list of one response per request "
                                 f"(1 here), got {count}")
        return self._outputs(responses[0])

    def infer_stream(self, inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        sent: queue.Queue[tuple[pb_utils.InferenceResponse | None, int]] = queue.Queue()
        request = self._request(inputs, pb_utils.ResponseSender(lambda response, flags: sent.put((response, flags))))
        returned = self._execute(request)
        if returned is not None:
            raise ExecutionError(f"{self._who} is decoupled: execute() must send its responses through "
                                 "request.get_response_sender() and return None")
        while True:
            response, flags = sent.get()
            if response is not None:
                yield self._outputs(response)
            if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                return

    def unload(self) -> None:
        model, self._model = self._model, None
        if model is not None and hasattr(model, "finalize"):
            _run(model.finalize())

    def _request(self, inputs: dict[str, np.ndarray],
                 sender: pb_utils.ResponseSender | None = None) -> pb_utils.InferenceRequest:
        return pb_utils.InferenceRequest(
            model_name=self._context.name, requested_output_names=[o.name for o in self._context.config.outputs],
            inputs=[pb_utils.Tensor(name, array) for name, array in inputs.items()],
            model_version=self._context.version, sender=sender)

    def _execute(self, request: pb_utils.InferenceRequest) -> Any:
        assert self._model is not None, "infer() before load()"
        try:
            return _run(self._model.execute([request]))
        except pb_utils.TritonModelException as exc:
            raise ExecutionError(f"{self._who}: {exc.message()}") from None
        except (ExecutionError, InvalidInput):
            raise
        except Exception as exc:
            raise ExecutionError(f"{self._who}: execute() raised {exc!r}") from None

    def _outputs(self, response: Any) -> dict[str, np.ndarray]:
        if not isinstance(response, pb_utils.InferenceResponse):
            raise ExecutionError(f"{self._who}: execute() must answer with pb_utils.InferenceResponse, "
                                 f"not {type(response).__name__}")
        error = response.error()
        if error is not None:
            if error.code() == pb_utils.TritonError.INVALID_ARG:
                raise InvalidInput(f"{self._who}: {error.message()}")
            raise ExecutionError(f"{self._who}: {error.message()}")
        return {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}


def _run(result: Any) -> Any:
    """``result``, awaited first when the model's method was a coroutine."""
    if inspect.isawaitable(result):
        return asyncio.run(_awaited(result))
    return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
