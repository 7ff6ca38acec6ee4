from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from workers.errors import ConfigError
from workers.repository.config import ModelConfig
from workers.repository.config_file import load_config
from workers.repository.pbtxt import parse

PATH = Path("repo/cnn/config.pbtxt")
BASE = 'name: "cnn" input { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } output { name: "y" data_type: TYPE_FP32 dims: [ 2 ] }\n'
TRITON_EXAMPLE = """
optimization { execution_accelerators {
  gpu_execution_accelerator : [ {
    name : "tensorrt"
    parameters { key: "precision_mode" value: "FP16" }
    parameters { key: "max_workspace_size_bytes" value: "1073741824" }
  } ]
} }
"""


def _load(extra: str) -> ModelConfig:
    return load_config(PATH, parse(BASE + extra, str(PATH)))


def test_tritons_tensorrt_accelerator_example_is_read_without_warnings():
    with capture_logs() as logs:
        config = _load(TRITON_EXAMPLE)
    assert config.optimization is not None
    tensorrt = config.optimization.gpu_accelerator("tensorrt")
    assert tensorrt is not None
    assert tensorrt.parameters == {"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824"}
    assert not [log for log in logs if log["log_level"] == "warning"]


def test_the_config_json_shows_accelerator_parameters_as_an_object():
    body = _load(TRITON_EXAMPLE).to_json()
    accelerator = body["optimization"]["execution_accelerators"]["gpu_execution_accelerator"][0]
    assert accelerator == {"name": "tensorrt",
                           "parameters": {"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824"}}


def test_precision_and_booleans_are_normalised():
    config = _load('optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" '
                   'parameters { key: "precision_mode" value: "fp16" } '
                   'parameters { key: "trt_engine_cache_enable" value: "1" } } ] } }')
    assert config.optimization is not None
    tensorrt = config.optimization.gpu_accelerator("tensorrt")
    assert tensorrt is not None and tensorrt.parameters["precision_mode"] == "FP16" and tensorrt.flag("trt_engine_cache_enable")


@pytest.mark.parametrize(("accelerators", "field", "message"), [
    ('gpu_execution_accelerator: [ { name: "tensorrtt" } ]',
     "optimization.execution_accelerators.gpu_execution_accelerator", "unknown accelerator 'tensorrtt'"),
    ('cpu_execution_accelerator: [ { name: "tensorrt" } ]',
     "optimization.execution_accelerators.cpu_execution_accelerator", "unknown accelerator 'tensorrt'"),
    ('gpu_execution_accelerator: [ { name: "tensorrt" parameters { key: "precision" value: "FP16" } } ]',
     "optimization.execution_accelerators.gpu_execution_accelerator", "has no parameter 'precision'"),
    ('gpu_execution_accelerator: [ { name: "tensorrt" parameters { key: "precision_mode" value: "FP8" } } ]',
     "optimization.execution_accelerators.gpu_execution_accelerator",
     "parameter 'precision_mode' must be one of FP32, FP16, INT8, got 'FP8'"),
    ('gpu_execution_accelerator: [ { name: "tensorrt" parameters { key: "max_workspace_size_bytes" value: "1G" } } ]',
     "optimization.execution_accelerators.gpu_execution_accelerator",
     "parameter 'max_workspace_size_bytes' must be a whole number"),
    ('gpu_execution_accelerator: [ { name: "tensorrt" }, { name: "tensorrt" } ]',
     "optimization.execution_accelerators.gpu_execution_accelerator", "named twice"),
])
def test_a_wrong_accelerator_fails_the_config_naming_field_and_key(accelerators, field, message):
    with pytest.raises(ConfigError) as caught:
        _load(f"optimization {{ execution_accelerators {{ {accelerators} }} }}")
    assert caught.value.field == field
    assert message in str(caught.value) and str(PATH) in str(caught.value)


def test_optimization_fields_ferry_does_not_act_on_are_logged_as_unsupported():
    with capture_logs() as logs:
        config = _load("optimization { graph { level: 1 } input_pinned_memory { enable: true } }")
    warned = {log["field"] for log in logs if log["event"] == "config.unsupported_field"}
    assert warned == {"optimization.graph", "optimization.input_pinned_memory"}
    assert config.to_json()["optimization"]["graph"] == {"level": 1}
