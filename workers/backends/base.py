"""The backend seam: load a model version, run batches on it, unload it.

``infer`` is synchronous and may block for the length of a batch; the worker
runs it on a thread of its own so a backend that releases the GIL (ONNX
Runtime does) computes while the event loop keeps serving.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from workers.repository.config import InstanceGroup, ModelConfig


@dataclass(frozen=True, slots=True)
class ModelContext:
    """What a backend is told about the model version it loads."""

    name: str
    version: int
    version_dir: Path
    model_file: Path
    config: ModelConfig
    instance: InstanceGroup
    instance_index: int = 0

    @property
    def parameters(self) -> dict[str, str]:
        return dict(self.config.parameters)


class Backend(Protocol):
    def load(self) -> None: ...

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def unload(self) -> None: ...


class PinningBackend(Backend, Protocol):
    """A backend whose device copies run fastest from memory it allocates itself
    (page-locked host memory for a GPU instance). ``host_allocator`` returns
    ``allocate(shape, dtype) -> array``, or None where plain numpy memory is as good."""

    def host_allocator(self) -> Callable[[tuple[int, ...], np.dtype], np.ndarray] | None: ...


class StreamingBackend(Backend, Protocol):
    """A backend for decoupled models: 0..N responses for one request."""

    def infer_stream(self, inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]: ...
