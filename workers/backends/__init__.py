"""Backends, chosen by a model config's ``backend`` (or ``platform``).

Each backend is imported only when a model needs it, so serving ONNX models
never imports torch, tensorrt or openvino. A backend whose framework is not
installed fails that model's load with the package to install.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType

from workers.backends.base import Backend, ModelContext
from workers.errors import ModelLoadError

BackendFactory = Callable[[ModelContext], Backend]

# backend name -> (module, class, the pip extra that brings its framework)
BACKENDS: Mapping[str, tuple[str, str, str]] = MappingProxyType({
    "onnxruntime": ("workers.backends.onnxruntime", "OnnxRuntimeBackend", ""),
    "python": ("workers.backends.python_process", "python_backend", ""),
    "pytorch": ("workers.backends.pytorch", "PyTorchBackend", "pytorch"),
    "tensorrt": ("workers.backends.tensorrt", "TensorRTBackend", "gpu"),
    "openvino": ("workers.backends.openvino", "OpenVinoBackend", "openvino"),
    "fil": ("workers.backends.trees", "TreeBackend", "trees"),
    "tensorflow": ("workers.backends.tensorflow", "TensorFlowBackend", "tensorflow"),
})

# Triton's platform names for the backends above.
PLATFORMS: Mapping[str, str] = MappingProxyType({
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
    "openvino": "openvino",
    "tensorflow_savedmodel": "tensorflow",
})


def backend_name(backend: str, platform: str) -> str:
    return backend or PLATFORMS.get(platform, platform)


def backend_factory(name: str, model: str = "") -> BackendFactory:
    """The class for backend ``name``; ModelLoadError if unknown or not installed."""
    found = BACKENDS.get(name)
    who = f"model '{model}': " if model else ""
    if found is None:
        raise ModelLoadError(f"{who}backend '{name}' is not supported (supported: {', '.join(sorted(BACKENDS))})")
    module_name, class_name, extra = found
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        hint = f"; install it with: pip install 'ferry[{extra}]'" if extra else ""
        raise ModelLoadError(f"{who}backend '{name}' needs {err.name or err}, which is not installed{hint}") from None
    factory: BackendFactory = getattr(module, class_name)
    return factory


def create_backend(context: ModelContext) -> Backend:
    name = backend_name(context.config.backend, context.config.platform)
    return backend_factory(name, context.name)(context)


__all__ = ["BACKENDS", "PLATFORMS", "Backend", "ModelContext", "backend_factory", "backend_name", "create_backend"]
