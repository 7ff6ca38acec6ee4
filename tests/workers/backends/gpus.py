"""Why a GPU test cannot run here, or None when it can."""

from __future__ import annotations

import importlib.util

import onnxruntime as ort


def cuda_devices() -> tuple[int, str]:
    """(device count, why none) through the CUDA runtime, without torch."""
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
        return 0, "cuda-python (cuda.bindings) is not installed"
    from cuda.bindings import runtime

    err, count = runtime.cudaGetDeviceCount()
    if err != runtime.cudaError_t.cudaSuccess:
        return 0, f"the CUDA runtime says {err.name}"
    return count, "" if count else "the CUDA runtime sees no device"


def no_gpu_reason(*, provider: str = "", tensorrt: bool = False) -> str | None:
    count, why = cuda_devices()
    if count == 0:
        return f"no NVIDIA GPU on this machine: {why}"
    if provider and provider not in ort.get_available_providers():
        return f"the installed onnxruntime has no {provider} (install ferry[gpu])"
    if tensorrt and importlib.util.find_spec("tensorrt") is None:
        return "the tensorrt package is not installed (install ferry[gpu])"
    return None
