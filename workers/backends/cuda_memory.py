"""GPU memory and streams through the CUDA runtime of ``cuda-python``.

The TensorRT backend needs device buffers, copies and one stream per
instance, nothing more. ``cuda-python`` (``cuda.bindings``) gives exactly
those calls, explicitly, in a few megabytes; torch could too, but weighs
gigabytes and hides which stream and allocation a copy uses. Every failure is
an ExecutionError naming the call and CUDA's error.

The current device is a per-thread setting in CUDA, and the worker may load
on one thread and infer on another, so every entry point sets it first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from cuda.bindings import runtime as cudart

from workers.errors import ExecutionError


def _checked(result: Any, call: str) -> Any:
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        raise ExecutionError(f"CUDA {call} failed: {getattr(err, 'name', err)}")
    return values[0] if len(values) == 1 else tuple(values)


def device_count() -> tuple[int, str]:
    """(GPUs the CUDA runtime sees, why none when it sees none)."""
    err, count = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess:
        return 0, f"the CUDA runtime says {err.name}"
    return count, "" if count else "the CUDA runtime sees no device"


def use_device(device: int) -> None:
    _checked(cudart.cudaSetDevice(device), f"cudaSetDevice({device})")


class Stream:
    """One CUDA stream; ``handle`` is the integer TensorRT's API takes."""

    def __init__(self, device: int) -> None:
        self.device = device
        use_device(device)
        flags = cudart.cudaStreamNonBlocking
        self._stream = _checked(cudart.cudaStreamCreateWithFlags(flags), "cudaStreamCreateWithFlags")

    @property
    def handle(self) -> int:
        return int(self._stream)

    @property
    def raw(self) -> Any:
        return self._stream

    def synchronize(self) -> None:
        _checked(cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")

    def close(self) -> None:
        if self._stream is not None:
            _checked(cudart.cudaStreamDestroy(self._stream), "cudaStreamDestroy")
            self._stream = None


class DeviceBuffer:
    """Device memory that grows to the largest batch it has carried."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.address = 0
        self.capacity = 0

    def reserve(self, nbytes: int) -> int:
        if nbytes > self.capacity:
            self.close()
            size = max(nbytes, 1)
            self.address = int(_checked(cudart.cudaMalloc(size), f"cudaMalloc({size} bytes) for '{self.name}'"))
            self.capacity = size
        return self.address

    def upload(self, array: np.ndarray, stream: Stream) -> None:
        host = np.ascontiguousarray(array)
        self.reserve(host.nbytes)
        _checked(cudart.cudaMemcpyAsync(self.address, host.ctypes.data, host.nbytes,
                                        cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream.raw),
                 f"cudaMemcpyAsync to '{self.name}'")

    def download(self, out: np.ndarray, stream: Stream) -> None:
        """Queue a copy into ``out`` (C-contiguous); valid after ``stream.synchronize()``."""
        _checked(cudart.cudaMemcpyAsync(out.ctypes.data, self.address, out.nbytes,
                                        cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream.raw),
                 f"cudaMemcpyAsync from '{self.name}'")

    def close(self) -> None:
        if self.address:
            _checked(cudart.cudaFree(self.address), f"cudaFree for '{self.name}'")
            self.address, self.capacity = 0, 0
