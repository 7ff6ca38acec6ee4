"""ONNX Runtime execution providers for one instance, from its kind and the
config's ``optimization.execution_accelerators``.

    KIND_CPU    the CPU accelerators (openvino), then CPU
    KIND_GPU    the GPU accelerators (tensorrt), CUDA on the instance's GPU, then CPU
    KIND_AUTO   as KIND_GPU when this onnxruntime has CUDA, else as KIND_CPU

A provider an instance needs and the installed onnxruntime lacks fails the
load, naming the provider and what to install: a GPU instance never drops to
the CPU silently. CPU stays last, as in Triton, for the few nodes a GPU
provider leaves to it.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.backends.devices import gpu_device
from workers.errors import ModelLoadError
from workers.repository.config import InstanceGroup, ModelConfig
from workers.repository.optimization_config import Accelerator, Optimization

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
OPENVINO = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"

Provider = str | tuple[str, dict[str, str]]

_INSTALL = {
    TENSORRT: "pip install 'ferry[gpu]' (onnxruntime-gpu and tensorrt)",
    CUDA: "pip install 'ferry[gpu]' (onnxruntime-gpu)",
    OPENVINO: "pip install onnxruntime-openvino",
}

# Triton's TensorRT accelerator keys -> ONNX Runtime's TensorRT provider options.
_TENSORRT_OPTIONS = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "minimum_segment_size": "trt_min_subgraph_size",
    "max_partition_iterations": "trt_max_partition_iterations",
    "trt_engine_cache_enable": "trt_engine_cache_enable",
    "trt_engine_cache_path": "trt_engine_cache_path",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}
_BOOLEAN_OPTIONS = {"trt_engine_cache_enable", "trt_int8_use_native_calibration_table"}


def tensorrt_options(accelerator: Accelerator, device: int) -> dict[str, str]:
    """ONNX Runtime's TensorRT provider options for a ``tensorrt`` accelerator."""
    precision = accelerator.parameters.get("precision_mode", "FP32")
    options = {
        "device_id": str(device),
        "trt_fp16_enable": _onnxruntime_bool(precision == "FP16"),
        "trt_int8_enable": _onnxruntime_bool(precision == "INT8"),
    }
    for key, value in accelerator.parameters.items():
        option = _TENSORRT_OPTIONS.get(key)
        if option is not None:
            options[option] = _onnxruntime_bool(value == "true") if option in _BOOLEAN_OPTIONS else value
    return options


def _onnxruntime_bool(value: bool) -> str:
    # ONNX Runtime's Python layer accepts exactly "True"/"False" (or 1/0) here.
    return "True" if value else "False"


def choose_providers(
    config: ModelConfig, instance: InstanceGroup, instance_index: int, available: Sequence[str]
) -> list[Provider]:
    """Providers in preference order; ModelLoadError when one is not installed."""
    optimization = config.optimization or Optimization()
    on_gpu = instance.kind == "KIND_GPU" or (instance.kind == "KIND_AUTO" and CUDA in available)
    wanted: list[Provider] = []
    if on_gpu:
        device = gpu_device(instance, instance_index)
        tensorrt = optimization.gpu_accelerator("tensorrt")
        if tensorrt is not None:
            wanted.append((TENSORRT, tensorrt_options(tensorrt, device)))
        wanted.append((CUDA, {"device_id": str(device)}))
    elif optimization.cpu_accelerator("openvino") is not None:
        wanted.append((OPENVINO, {}))
    _require(config, instance, [provider_name(p) for p in wanted], available)
    return [*wanted, CPU]


def provider_name(provider: Provider) -> str:
    return provider if isinstance(provider, str) else provider[0]


def _require(config: ModelConfig, instance: InstanceGroup, names: list[str], available: Sequence[str]) -> None:
    for name in names:
        if name not in available:
            raise ModelLoadError(
                f"model '{config.name}' instance group '{instance.name}' ({instance.kind}) needs ONNX Runtime's "
                f"{name}, which the installed onnxruntime lacks (it has: {', '.join(available)}); "
                f"install it with: {_INSTALL[name]}"
            )


def check_active(
    config: ModelConfig, instance: InstanceGroup, requested: Sequence[Provider], active: Sequence[str]
) -> list[str]:
    """The requested providers ONNX Runtime did not start. It drops one that
    fails (no GPU, no driver) and carries on with the CPU; for a KIND_GPU
    instance ferry makes that a load error. KIND_AUTO means "a GPU if there is
    one", so there the caller only logs it."""
    dropped = [name for name in map(provider_name, requested) if name not in active]
    if dropped and instance.kind == "KIND_GPU":
        raise ModelLoadError(
            f"model '{config.name}' instance group '{instance.name}' (KIND_GPU): ONNX Runtime could not start "
            f"{', '.join(dropped)} (active: {', '.join(active)}); is an NVIDIA GPU with a matching driver present?"
        )
    return dropped
