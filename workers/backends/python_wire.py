"""What crosses between a worker and a Python model's instance process.

A frame is a 4-byte little-endian length, a msgpack header of that length,
then the raw bytes of each fixed-size tensor the header lists, back to back:

    header = {"op": "infer", "tensors": [[name, dtype, shape, payload], ...], ...}

``dtype`` is numpy's ``dtype.str`` (``"<f4"``), an ml_dtypes name
(``"bfloat16"``), or ``"O"`` for an object array (BYTES), whose payload is the
list of its elements inline in the header; a fixed-size tensor's payload is
its byte count, and its bytes follow the header unencoded: written from the
array and read into the new one's buffer, with no pickle and no copy in
between (a 64 MiB tensor there and back takes some 40 ms). Both ends are
ferry's own, so a frame that does not parse is a broken instance process, not
bad input. (Shared memory would save the socket's two copies; the models
this is for are GIL-bound compute on small tensors, so it is left out.)

Errors cross as plain data (``error_body``/``error_from``): a WorkerError the
backend raised comes back as the same class and message; any other exception
as the ExecutionError ``error_of`` would have made of it in process.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import msgpack
import numpy as np

from workers.backends.base import ModelContext
from workers.errors import (ExecutionError, InvalidInput, ModelLoadError, ModelNotFound, RequestTimeout,
                            SequenceError, SessionLost, TensorError, WorkerError)
from workers.repository.config import InstanceGroup, ModelConfig

Tensors = dict[str, np.ndarray]
Header = dict[str, Any]

_LENGTH = struct.Struct("<I")
_JOIN_BELOW = 256 * 1024  # smaller frames go out in one write; larger ones without joining their tensors
_ERRORS: dict[str, type[WorkerError]] = {cls.__name__: cls for cls in (
    ExecutionError, InvalidInput, TensorError, SequenceError, ModelLoadError, ModelNotFound,
    RequestTimeout, SessionLost)}


class ChannelClosed(Exception):
    """The other end is gone (it closed its socket, its process died), or sent
    a frame that does not parse, after which the stream cannot be trusted."""


class Channel:
    """One end of the socket between a worker and an instance process."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def send(self, header: Header, tensors: Tensors | None = None) -> None:
        """Encodes everything first, so an output that cannot cross fails before a byte is written."""
        specs, buffers = encode_tensors(tensors or {})
        body = msgpack.packb({**header, "tensors": specs}, use_bin_type=True, default=_plain)
        parts: list[bytes | memoryview] = [_LENGTH.pack(len(body)), body, *buffers]
        try:
            if len(body) + sum(len(b) for b in buffers) < _JOIN_BELOW:
                self._sock.sendall(b"".join(parts))
            else:
                for part in parts:
                    self._sock.sendall(part)
        except OSError as exc:  # BrokenPipeError, ConnectionResetError
            raise ChannelClosed(str(exc)) from None

    def receive(self, timeout_s: float | None = None) -> tuple[Header, Tensors]:
        """The next frame; ChannelClosed if the other end is gone or ``timeout_s`` passes first."""
        self._sock.settimeout(timeout_s)
        try:
            return self._frame()
        except ChannelClosed:
            raise
        except Exception as exc:  # msgpack's errors, a bad tensor spec, dtype or shape
            raise ChannelClosed(f"a frame that does not parse: {exc!r}") from None
        finally:
            self._sock.settimeout(None)

    def close(self) -> None:
        self._sock.close()

    def _frame(self) -> tuple[Header, Tensors]:
        (length,) = _LENGTH.unpack(self._read(_LENGTH.size).data)
        header = msgpack.unpackb(self._read(length).data, raw=False, strict_map_key=True)
        if not isinstance(header, dict) or not isinstance(header.get("tensors"), list):
            raise ValueError("no tensor list")
        specs = header.pop("tensors")
        return header, dict(self._tensor(spec) for spec in specs)

    def _tensor(self, spec: Any) -> tuple[str, np.ndarray]:
        if not isinstance(spec, list) or len(spec) != 4:
            raise ValueError(f"a tensor spec that is not [name, dtype, shape, payload]: {spec!r}")
        name, code, shape, payload = spec
        if code == "O":
            array = np.empty(len(payload), dtype=object)
            array[:] = payload
            return name, array.reshape(shape)
        return name, self._read(payload).view(_dtype(code)).reshape(shape)

    def _read(self, size: int) -> np.ndarray:
        """Exactly ``size`` bytes, in a writable buffer an array may keep (not zeroed first:
        that would cost as much as the copy out of the socket)."""
        buffer = np.empty(size, dtype=np.uint8)
        view = buffer.data
        while view:
            try:
                got = self._sock.recv_into(view)
            except OSError as exc:  # ConnectionResetError, or TimeoutError past the timeout
                raise ChannelClosed(str(exc) or type(exc).__name__) from None
            if got == 0:
                raise ChannelClosed("end of stream")
            view = view[got:]
        return buffer


def encode_tensors(tensors: Tensors) -> tuple[list[list[Any]], list[memoryview]]:
    """(the header's tensor specs, the raw buffers that follow it)."""
    specs: list[list[Any]] = []
    buffers: list[memoryview] = []
    for name, value in tensors.items():
        array = np.asarray(value)
        shape = list(array.shape)
        if array.dtype.kind == "O":
            specs.append([name, "O", shape, array.reshape(-1).tolist()])
            continue
        flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        specs.append([name, _dtype_code(name, array.dtype), shape, flat.nbytes])
        buffers.append(flat.data)
    return specs, buffers


def _dtype_code(name: str, dtype: np.dtype) -> str:
    if dtype.fields is None and np.dtype(dtype.str) == dtype:
        return dtype.str
    if dtype.type.__module__ == "ml_dtypes":
        return dtype.name
    raise ExecutionError(f"tensor '{name}': numpy dtype {dtype} cannot leave the instance process")


def _dtype(code: str) -> np.dtype:
    if code.isidentifier():  # an ml_dtypes name; numpy's own codes start with <, >, | or =
        extension: np.dtype = np.dtype(getattr(ml_dtypes, code))
        return extension
    return np.dtype(code)


def _plain(value: Any) -> Any:
    """msgpack's fallback for an object array's elements: numpy scalars as Python ones."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return str(value)  # as a BYTES element would be sent (workers.datatypes.as_bytes)


def error_body(exc: BaseException) -> Header:
    return {"type": type(exc).__name__, "message": str(exc), "worker_error": isinstance(exc, WorkerError)}


def error_from(body: Any) -> WorkerError:
    """The error an instance process reported, as the worker would have seen it in process."""
    kind, message = str(body.get("type", "Exception")), str(body.get("message", ""))
    if body.get("worker_error"):
        return _ERRORS.get(kind, ExecutionError)(message)
    return ExecutionError(f"{kind}: {message}")


def context_body(context: ModelContext) -> Header:
    return {
        "name": context.name, "version": context.version, "version_dir": str(context.version_dir),
        "model_file": str(context.model_file), "instance_index": context.instance_index,
        # Only the fields the config set: its defaults do not all validate again once written out.
        "config": context.config.model_dump(mode="json", by_alias=True, exclude_unset=True),
        "instance": context.instance.model_dump(mode="json", by_alias=True, exclude_unset=True),
    }


def context_from(body: Header) -> ModelContext:
    return ModelContext(
        name=body["name"], version=body["version"], version_dir=Path(body["version_dir"]),
        model_file=Path(body["model_file"]), instance_index=body["instance_index"],
        config=ModelConfig.model_validate(body["config"]), instance=InstanceGroup.model_validate(body["instance"]),
    )
