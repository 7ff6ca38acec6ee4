"""PyTorch backend: TorchScript (``model.pt``) and ``torch.export`` programs
(``model.pt2``), never pickles (see ``workers.backends.torch_archives``).

Placement follows the instance group: KIND_CPU runs on the CPU; KIND_GPU on
``cuda:<gpu>``, the instance's index choosing among the group's ``gpus``
(all visible devices when none are named), and fails its load where torch
sees no CUDA device; KIND_AUTO takes a GPU when there is one; KIND_MODEL
keeps the device the weights were saved on. Inputs and outputs bind by name
or by Triton's ``INPUT__0``/``OUTPUT__0`` positions (``torch_binding``).

torch's thread pools are process-wide: parameters ``intra_op_thread_count``
and ``inter_op_thread_count`` set them; by default each of several instances
gets an equal share of the cores.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import torch

from workers.backends.base import ModelContext
from workers.backends.devices import gpu_device
from workers.backends.torch_archives import check_exported_program, check_graph_targets, check_torchscript, read_archive
from workers.backends.torch_binding import (
    host_numpy,
    input_order,
    outputs_by_name,
    pinned_array,
    to_host,
    to_torch,
)
from workers.datatypes import datatype_of
from workers.errors import ExecutionError, InvalidInput, ModelLoadError
from workers.repository.config import InstanceGroup

log = structlog.get_logger("ferry.backend.pytorch")

EXPORTED_SUFFIX = ".pt2"


def choose_device(instance: InstanceGroup, instance_index: int, cuda_devices: int) -> str:
    """``cpu``, ``cuda:<n>``, or ``model`` (leave tensors where the file put them)."""
    if instance.kind == "KIND_CPU":
        return "cpu"
    if instance.kind == "KIND_MODEL":
        return "model"
    if cuda_devices == 0:
        if instance.kind == "KIND_GPU":
            raise ModelLoadError(f"instance group '{instance.name}' is KIND_GPU, but torch sees no CUDA device "
                                 f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
                                 "use KIND_CPU or KIND_AUTO here")
        return "cpu"
    gpu = gpu_device(instance, instance_index, cuda_devices)
    if gpu >= cuda_devices:
        raise ModelLoadError(f"instance group '{instance.name}' names GPU {gpu}, but torch sees "
                             f"{cuda_devices} CUDA device(s)")
    return f"cuda:{gpu}"


class PyTorchBackend:
    def __init__(self, context: ModelContext) -> None:
        self._context = context
        self._module: Callable[..., Any] | None = None
        self._device = torch.device("cpu")
        self._order: tuple[str, ...] = ()
        self._outputs: tuple[str, ...] = ()
        self._stream: Any = None  # torch.cuda.Stream of a GPU instance

    def load(self) -> None:
        config = self._context.config
        path = self._model_path()
        bytes_tensors = [t.name for t in (*config.inputs, *config.outputs) if t.datatype == "BYTES"]
        if bytes_tensors:
            raise ModelLoadError(f"{path}: the pytorch backend has no BYTES tensors ('{bytes_tensors[0]}')")
        placement = choose_device(self._context.instance, self._context.instance_index, torch.cuda.device_count())
        self._set_threads()
        module, forward_args = self._load_module(path, placement)
        self._device = _module_device(module) if placement == "model" else torch.device(placement)
        self._order = input_order(path, self._input_names(), forward_args)
        self._outputs = tuple(o.name for o in config.outputs) + config.state_outputs
        self._module = module
        if self._device.type == "cuda":
            # Its own stream per instance: copies and compute of two instances' batches overlap.
            self._stream = torch.cuda.Stream(self._device)
        log.info("pytorch.loaded", model=self._context.name, version=self._context.version,
                 file=path.name, device=str(self._device), inputs=list(self._order))

    def host_allocator(self) -> Callable[[tuple[int, ...], np.dtype], np.ndarray] | None:
        """Pinned memory for a GPU instance's batches: their copies to the device are then
        asynchronous on the instance's stream."""
        return pinned_array if self._stream is not None else None

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self._module is not None, "infer() before load()"
        try:
            if self._stream is None:
                arrays = self._run(inputs, non_blocking=False)
            else:
                with torch.cuda.stream(self._stream):
                    arrays = self._run(inputs, non_blocking=True)
        except (ExecutionError, InvalidInput):
            raise
        except Exception as exc:  # noqa: BLE001 - a model's failure fails this batch, never the worker
            raise ExecutionError(f"model '{self._context.name}': forward failed: "
                                 f"{type(exc).__name__}: {_first_line(exc)}") from None
        self._check_datatypes(arrays)
        return arrays

    def _run(self, inputs: dict[str, np.ndarray], non_blocking: bool) -> dict[str, np.ndarray]:
        """Copy in, compute, copy out; on a stream, every step is queued and one
        synchronisation waits for all of them before the host memory is read or reused."""
        assert self._module is not None
        args = [to_torch(inputs[name], self._device, non_blocking) if name in inputs else None
                for name in self._order]
        with torch.inference_mode():
            result = self._module(*args)
            tensors = outputs_by_name(self._context.name, result, self._outputs)
            host = {name: to_host(tensor, non_blocking) for name, tensor in tensors.items()}
        if self._stream is not None:
            self._stream.synchronize()
        return {name: host_numpy(tensor) for name, tensor in host.items()}

    def unload(self) -> None:
        self._module = None
        self._stream = None
        if self._device.type == "cuda":
            torch.cuda.empty_cache()

    def _model_path(self) -> Path:
        path = self._context.model_file
        exported = self._context.version_dir / f"model{EXPORTED_SUFFIX}"
        # An explicit backend "pytorch" gets model.pt by default; a version
        # directory holding only model.pt2 still means the exported program.
        if not path.exists() and path.name == "model.pt" and exported.is_file():
            return exported
        if not path.is_file():
            raise ModelLoadError(f"{path}: missing (the pytorch backend reads model.pt or model.pt2)")
        return path

    def _load_module(self, path: Path, placement: str) -> tuple[Callable[..., Any], Sequence[str]]:
        data = read_archive(path)
        if path.suffix == EXPORTED_SUFFIX:
            check_exported_program(path, data)
            return self._load_exported(path, data, placement)
        check_torchscript(path, data)
        return self._load_torchscript(path, data, placement)

    def _load_torchscript(self, path: Path, data: bytes, placement: str) -> tuple[Callable[..., Any], Sequence[str]]:
        import io

        location = None if placement == "model" else torch.device(placement)
        try:
            with warnings.catch_warnings():
                # torch 2.10+ deprecates TorchScript; ferry still serves it.
                warnings.simplefilter("ignore", FutureWarning)
                warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.11 warns with this class
                module = torch.jit.load(io.BytesIO(data), map_location=location)
        except Exception as exc:  # noqa: BLE001 - libtorch raises RuntimeError of many kinds
            raise ModelLoadError(f"{path}: torch.jit.load refused it: {_first_line(exc)}") from None
        module.eval()
        arguments = [arg.name for arg in module.forward.schema.arguments[1:]]
        return module, arguments

    def _load_exported(self, path: Path, data: bytes, placement: str) -> tuple[Callable[..., Any], Sequence[str]]:
        import io

        try:
            with warnings.catch_warnings():
                # torch 2.11 warns that the archive's bytes are read-only; they stay unwritten.
                warnings.filterwarnings("ignore", message="The given buffer is not writable")
                program = torch.export.load(io.BytesIO(data))
            if placement not in ("model", "cpu"):
                from torch.export.passes import move_to_device_pass

                program = move_to_device_pass(program, placement)
        except Exception as exc:  # noqa: BLE001 - torch's deserialiser raises many kinds
            raise ModelLoadError(f"{path}: torch.export.load refused it: {_first_line(exc)}") from None
        check_graph_targets(path, _graph_modules(program.graph_module))
        signature = program.module_call_graph[0].signature
        arguments = list(getattr(signature, "forward_arg_names", None) or program.graph_signature.user_inputs)
        # The guards are Python source from the file: never compiled here.
        return program.module(check_guards=False), arguments

    def _input_names(self) -> list[str]:
        config = self._context.config
        names = [i.name for i in config.inputs]
        batching = config.sequence_batching
        if batching is not None:
            names += [control.name for control in batching.control_input]
            names += [state.input_name for state in batching.state]
        return names

    def _set_threads(self) -> None:
        params = self._context.parameters
        count = max(1, self._context.config.instance_count)
        default = max(1, (os.cpu_count() or 1) // count) if count > 1 else 0
        intra = int(params.get("intra_op_thread_count", default))
        if intra > 0:
            torch.set_num_threads(intra)
        inter = int(params.get("inter_op_thread_count", 0))
        if inter > 0 and torch.get_num_interop_threads() != inter:
            try:
                torch.set_num_interop_threads(inter)
            except RuntimeError:  # only settable before torch's first parallel work
                log.warning("pytorch.interop_threads_fixed", model=self._context.name,
                            wanted=inter, current=torch.get_num_interop_threads())

    def _check_datatypes(self, arrays: dict[str, np.ndarray]) -> None:
        for spec in self._context.config.outputs:
            got = datatype_of(arrays[spec.name])
            if got != spec.datatype:
                raise ExecutionError(f"model '{self._context.name}': output '{spec.name}' is {got}, "
                                     f"but the config says {spec.datatype}")


def _module_device(module: Any) -> torch.device:
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


def _graph_modules(root: Any) -> Any:
    return (m for m in root.modules() if isinstance(m, torch.fx.GraphModule))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
