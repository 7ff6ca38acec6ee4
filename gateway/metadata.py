"""Rendering server and model metadata as KServe V2 JSON."""

from __future__ import annotations

from typing import Any

from workers.repository.config import ModelConfig, TensorConfig

SERVER_NAME = "ferry"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ("binary_tensor_data", "classification", "logging", "model_configuration", "parameters",
              "statistics", "system_shared_memory", "trace")


def server_metadata(name: str = SERVER_NAME) -> dict[str, Any]:
    return {"name": name, "version": SERVER_VERSION, "extensions": list(EXTENSIONS)}


def model_metadata(config: ModelConfig, versions: tuple[int, ...]) -> dict[str, Any]:
    return {
        "name": config.name,
        "versions": [str(v) for v in versions],
        "platform": config.platform or config.backend,
        "inputs": [_tensor(t, config) for t in config.inputs],
        "outputs": [_tensor(t, config) for t in config.outputs],
    }


def _tensor(spec: TensorConfig, config: ModelConfig) -> dict[str, Any]:
    batch = [-1] if config.max_batch_size > 0 else []
    return {"name": spec.name, "datatype": spec.datatype, "shape": [*batch, *spec.dims]}
