"""TensorRT backend: serialized engines (``model.plan``) through TensorRT 10's
Python API.

Each instance deserializes its own engine on its GPU and owns one execution
context, one CUDA stream and its device buffers, so instances never share a
context or a profile. A batch picks the optimization profile that takes its
shapes (``tensorrt_io.choose_profile``); the context switches profile only
when the batch needs another. The engine decides the I/O datatypes (an FP16
engine usually keeps FP32 I/O); the config must agree with them.

Importing this module needs ``tensorrt`` and ``cuda-python``; the backend
registry turns their absence into a load error naming ``ferry[gpu]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import structlog
import tensorrt as trt

from workers.backends.base import ModelContext
from workers.backends.cuda_memory import DeviceBuffer, Stream, device_count, use_device
from workers.backends.devices import gpu_device
from workers.backends.tensorrt_io import EngineTensor, Profile, ShapeRange, check_engine, choose_profile, triton_datatype
from workers.datatypes import numpy_dtype
from workers.errors import ExecutionError, InvalidInput, ModelLoadError, WorkerError

log = structlog.get_logger("ferry.backend.tensorrt")

_LOGGER = trt.Logger(trt.Logger.WARNING)


class TensorRTBackend:
    def __init__(self, context: ModelContext) -> None:
        self._context = context
        self._device = gpu_device(context.instance, context.instance_index)
        self._engine: trt.ICudaEngine | None = None
        self._execution: trt.IExecutionContext | None = None
        self._stream: Stream | None = None
        self._tensors: dict[str, EngineTensor] = {}
        self._profiles: list[Profile] = []
        self._profile = 0
        self._buffers: dict[str, DeviceBuffer] = {}

    def load(self) -> None:
        if self._context.instance.kind == "KIND_CPU":
            raise ModelLoadError(f"model '{self._context.name}': TensorRT runs on NVIDIA GPUs only; instance group "
                                 f"'{self._context.instance.name}' is KIND_CPU")
        count, why = device_count()
        if self._device >= count:
            raise ModelLoadError(f"model '{self._context.name}': no GPU {self._device} for TensorRT: "
                                 f"{why or f'the CUDA runtime sees {count} GPU(s)'}")
        try:
            self._load_engine(self._context.model_file)
        except (WorkerError, OSError) as err:
            self.unload()
            raise ModelLoadError(f"{self._context.model_file}: {err}") from None
        log.info("tensorrt.loaded", model=self._context.name, version=self._context.version, device=self._device,
                 profiles=len(self._profiles), io={t.name: t.datatype for t in self._tensors.values()})

    def _load_engine(self, plan: Path) -> None:
        use_device(self._device)
        self._engine = trt.Runtime(_LOGGER).deserialize_cuda_engine(plan.read_bytes())
        if self._engine is None:
            raise ModelLoadError("TensorRT could not deserialize the engine (built by another TensorRT version, "
                                 "for another GPU, or not an engine at all?); see the TensorRT log above")
        self._tensors = {t.name: t for t in map(self._engine_tensor, range(self._engine.num_io_tensors))}
        self._profiles = [self._profile_of(i) for i in range(self._engine.num_optimization_profiles)]
        check_engine(self._context.config, list(self._tensors.values()), self._profiles)
        self._stream = Stream(self._device)
        self._execution = self._engine.create_execution_context()
        if self._execution is None:
            raise ModelLoadError("TensorRT could not create an execution context (out of GPU memory?)")
        self._switch_profile(0)
        self._buffers = {name: DeviceBuffer(name) for name in self._tensors}

    def _engine_tensor(self, index: int) -> EngineTensor:
        assert self._engine is not None
        name = self._engine.get_tensor_name(index)
        if self._engine.is_shape_inference_io(name):
            raise ModelLoadError(f"engine tensor '{name}' is a shape tensor, which ferry does not feed")
        return EngineTensor(
            name=name,
            is_input=self._engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT,
            datatype=triton_datatype(name, self._engine.get_tensor_dtype(name).name),
            shape=tuple(self._engine.get_tensor_shape(name)),
        )

    def _profile_of(self, index: int) -> Profile:
        assert self._engine is not None
        ranges: dict[str, ShapeRange] = {}
        for tensor in self._tensors.values():
            if not tensor.is_input:
                continue
            if -1 not in tensor.shape:
                ranges[tensor.name] = ShapeRange(tensor.shape, tensor.shape, tensor.shape)
                continue
            low, opt, high = self._engine.get_tensor_profile_shape(tensor.name, index)
            ranges[tensor.name] = ShapeRange(tuple(low), tuple(opt), tuple(high))
        return Profile(index, ranges)

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self._execution is not None and self._stream is not None, "infer() before load()"
        use_device(self._device)
        arrays = {name: self._input_array(name, array) for name, array in inputs.items()}
        self._switch_profile(choose_profile(self._profiles, {n: a.shape for n, a in arrays.items()}))
        for name, array in arrays.items():
            self._buffers[name].upload(array, self._stream)
            self._bind(name, self._buffers[name].address)
            if not self._execution.set_input_shape(name, array.shape):
                raise InvalidInput(f"input '{name}': TensorRT refused shape {list(array.shape)}")
        outputs = {spec.name: self._output_array(spec.name) for spec in self._context.config.outputs}
        if not self._execution.execute_async_v3(self._stream.handle):
            raise ExecutionError(f"model '{self._context.name}': TensorRT execute_async_v3 failed; see its log")
        for name, out in outputs.items():
            self._buffers[name].download(out, self._stream)
        self._stream.synchronize()
        return outputs

    def _input_array(self, name: str, array: np.ndarray) -> np.ndarray:
        tensor = self._tensors.get(name)
        if tensor is None or not tensor.is_input:
            raise InvalidInput(f"input '{name}': the TensorRT engine has no input of that name")
        dtype = numpy_dtype(tensor.datatype)
        if array.dtype != dtype:
            raise InvalidInput(f"input '{name}': the TensorRT engine takes {tensor.datatype}, got numpy {array.dtype}")
        spec = self._context.config.input(name)
        if spec is not None and spec.reshape is not None:
            prefix = array.shape[:1] if self._context.config.max_batch_size > 0 else ()
            array = array.reshape(prefix + tuple(spec.reshape.shape))
        return np.ascontiguousarray(array)

    def _output_array(self, name: str) -> np.ndarray:
        assert self._execution is not None
        shape = tuple(self._execution.get_tensor_shape(name))
        if any(dim < 0 for dim in shape):
            raise ExecutionError(f"output '{name}': TensorRT cannot tell its shape before running "
                                 f"({list(shape)}); data-dependent output shapes are not supported")
        out = np.empty(shape, dtype=numpy_dtype(self._tensors[name].datatype))
        self._bind(name, self._buffers[name].reserve(out.nbytes))
        return out

    def _bind(self, name: str, address: int) -> None:
        assert self._execution is not None
        if not self._execution.set_tensor_address(name, address):
            raise ExecutionError(f"tensor '{name}': TensorRT refused its device address")

    def _switch_profile(self, index: int) -> None:
        assert self._execution is not None and self._stream is not None
        if index == self._profile and self._execution.active_optimization_profile == index:
            return
        if not self._execution.set_optimization_profile_async(index, self._stream.handle):
            raise ExecutionError(f"model '{self._context.name}': TensorRT could not switch to profile {index}")
        self._profile = index

    def unload(self) -> None:
        for buffer in self._buffers.values():
            buffer.close()
        self._buffers = {}
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        # Release the context before the engine that owns it.
        self._execution = None
        self._engine = None
