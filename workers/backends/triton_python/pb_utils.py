"""``triton_python_backend_utils``, the module Triton's Python models import as ``pb_utils``.

Written for ferry: the classes and functions Triton's Python backend documents
(``Tensor``, ``InferenceRequest``, ``InferenceResponse``, ``TritonError``,
``TritonModelException``, the ``get_*_by_name`` helpers, the response sender of
a decoupled model, the flags), with numpy arrays underneath. A request a model
makes itself (business logic scripting) goes to ``bls.current()``, the caller
the worker installed.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import structlog

MODULE_NAME = "triton_python_backend_utils"  # the name Triton's Python models import this module by
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_MEMORY_CPU = 0

_TRITON_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


class TritonModelException(Exception):
    """Raised by ``pb_utils`` calls that fail, and by models to fail a request."""

    def message(self) -> str:
        return str(self)


class TritonError:
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = 1) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class Tensor:
    def __init__(self, name: str, array: Any) -> None:
        array = np.asarray(array)
        if array.dtype.kind == "U":
            array = array.astype(np.object_)  # strings travel as BYTES, as in Triton
        if array.dtype.kind == "V":
            raise TritonModelException(f"tensor '{name}': dtype {array.dtype} is not supported; use np.object_")
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        return Tensor(name, np.from_dlpack(capsule))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={list(self._array.shape)}, dtype={self._array.dtype})"


class InferenceResponse:
    def __init__(self, output_tensors: Sequence[Tensor] | None = None, error: TritonError | None = None,
                 parameters: dict[str, Any] | str | None = None) -> None:
        if output_tensors is not None and not isinstance(output_tensors, (list, tuple)):
            raise TritonModelException('"output_tensors" must be a list of pb_utils.Tensor')
        self._outputs = list(output_tensors or [])
        self._error = error
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class ResponseSender:
    """A decoupled model's way to answer: any number of ``send`` calls, the last with the final flag."""

    def __init__(self, deliver: Callable[[InferenceResponse | None, int], None]) -> None:
        self._deliver = deliver
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self._closed:
            raise TritonModelException("the response sender is closed: the final flag was already sent")
        if response is None and flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise TritonModelException("send() without a response must carry TRITONSERVER_RESPONSE_COMPLETE_FINAL")
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True
        self._deliver(response, flags)

    def is_cancelled(self) -> bool:
        return False


class InferenceRequest:
    """A request as ``execute`` receives it, or one a model builds to call another model (BLS)."""

    def __init__(self, model_name: str = "", requested_output_names: Sequence[str] = (),
                 inputs: Sequence[Tensor] = (), model_version: int = -1, flags: int = 0,
                 correlation_id: int | str = 0, timeout: int = 0, preferred_memory: Any = None,
                 parameters: dict[str, Any] | str | None = None, request_id: str = "",
                 sender: ResponseSender | None = None) -> None:
        self._model_name = model_name
        self._outputs = list(requested_output_names)
        self._inputs = list(inputs)
        self._version = model_version
        self._flags = flags
        self._correlation_id = correlation_id
        self._timeout = timeout
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})
        self._request_id = request_id
        self._sender = sender

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def model_name(self) -> str:
        return self._model_name

    def is_cancelled(self) -> bool:
        return False

    def get_response_sender(self) -> ResponseSender:
        if self._sender is None:
            raise TritonModelException("only a decoupled model's requests have a response sender")
        return self._sender

    def exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """Run this request on ``model_name`` (business logic scripting); a failure is the response's error."""
        from workers.backends.triton_python import bls  # the caller the worker installed

        response = bls.infer(self._model_name, self._version, self._inputs, self._outputs,
                             json.loads(self._parameters), self._timeout)
        return iter([response]) if decoupled else response

    async def async_exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """``exec`` without blocking the model's event loop: many may run at once."""
        return await asyncio.to_thread(self.exec, decoupled)


class Logger:
    _log = structlog.get_logger("ferry.python_model")

    @classmethod
    def log_info(cls, message: str) -> None:
        cls._log.info("model.log", message=message)

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls._log.warning("model.log", message=message)

    @classmethod
    def log_error(cls, message: str) -> None:
        cls._log.error("model.log", message=message)

    @classmethod
    def log_verbose(cls, message: str) -> None:
        cls._log.debug("model.log", message=message)

    log = log_info


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((i for i in model_config.get("input", []) if i.get("name") == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((o for o in model_config.get("output", []) if o.get("name") == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def triton_string_to_numpy(triton_type: str) -> Any:
    return _TRITON_TO_NUMPY[triton_type]


def serialize_byte_tensor(array: np.ndarray) -> np.ndarray | None:
    """BYTES elements as Triton lays them out: each a 4-byte little-endian length, then its bytes."""
    if array.size == 0:
        return None
    parts = []
    for item in array.ravel(order="C"):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(data)) + data)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded: bytes) -> np.ndarray:
    items, offset = [], 0
    while offset < len(encoded):
        (length,) = struct.unpack_from("<I", encoded, offset)
        offset += 4
        items.append(bytes(encoded[offset:offset + length]))
        offset += length
    return np.array(items, dtype=np.object_)


def make_importable() -> None:
    """Let ``import triton_python_backend_utils`` find this module, before a model's ``model.py`` runs."""
    sys.modules.setdefault(MODULE_NAME, sys.modules[__name__])
