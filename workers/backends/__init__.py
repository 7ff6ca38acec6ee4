"""Backends, chosen by a model config's ``backend`` (or ``platform``)."""

from __future__ import annotations

from collections.abc import Callable

from workers.backends.base import Backend, ModelContext
from workers.backends.onnxruntime import OnnxRuntimeBackend
from workers.backends.python import PythonBackend
from workers.errors import ModelLoadError

BackendFactory = Callable[[ModelContext], Backend]

BACKENDS: dict[str, BackendFactory] = {
    "onnxruntime": OnnxRuntimeBackend,
    "python": PythonBackend,
}

_PLATFORMS = {"onnxruntime_onnx": "onnxruntime"}


def backend_name(backend: str, platform: str) -> str:
    return backend or _PLATFORMS.get(platform, platform)


def create_backend(context: ModelContext) -> Backend:
    name = backend_name(context.config.backend, context.config.platform)
    factory = BACKENDS.get(name)
    if factory is None:
        raise ModelLoadError(f"model '{context.name}': backend '{name}' is not supported "
                             f"(supported: {', '.join(sorted(BACKENDS))})")
    return factory(context)


__all__ = ["BACKENDS", "Backend", "ModelContext", "backend_name", "create_backend"]
