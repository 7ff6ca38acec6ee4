"""A TensorRT engine's I/O as plain data, and the decisions made on it.

Kept free of ``tensorrt`` so it is tested everywhere: the Triton datatype of
an engine tensor, whether the model config agrees with the engine, and which
optimization profile takes a batch's shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from workers.datatypes import element_count
from workers.errors import InvalidInput, ModelLoadError
from workers.repository.config import ModelConfig, TensorConfig

# ``tensorrt.DataType`` member names -> Triton datatypes. FP8, INT4 and FP4
# exist only inside engines; no Triton datatype carries them in or out.
TENSORRT_TO_TRITON: Mapping[str, str] = MappingProxyType({
    "FLOAT": "FP32",
    "HALF": "FP16",
    "BF16": "BF16",
    "INT8": "INT8",
    "INT32": "INT32",
    "INT64": "INT64",
    "BOOL": "BOOL",
    "UINT8": "UINT8",
})
TRITON_TO_TENSORRT: Mapping[str, str] = MappingProxyType({v: k for k, v in TENSORRT_TO_TRITON.items()})

Shape = tuple[int, ...]


def triton_datatype(tensor: str, tensorrt_name: str) -> str:
    try:
        return TENSORRT_TO_TRITON[tensorrt_name]
    except KeyError:
        raise ModelLoadError(f"engine tensor '{tensor}' has TensorRT type {tensorrt_name}, which no Triton "
                             f"datatype carries (supported: {', '.join(TENSORRT_TO_TRITON)})") from None


@dataclass(frozen=True, slots=True)
class EngineTensor:
    name: str
    is_input: bool
    datatype: str  # Triton's name
    shape: Shape  # -1 where the engine takes any size


@dataclass(frozen=True, slots=True)
class ShapeRange:
    min: Shape
    opt: Shape
    max: Shape

    def holds(self, shape: Shape) -> bool:
        return len(shape) == len(self.min) and all(
            low <= dim <= high for low, dim, high in zip(self.min, shape, self.max))

    def describe(self) -> str:
        return "[" + ", ".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in zip(self.min, self.max)) + "]"


@dataclass(frozen=True, slots=True)
class Profile:
    index: int
    inputs: Mapping[str, ShapeRange]

    def holds(self, shapes: Mapping[str, Shape]) -> bool:
        return all(self.inputs[name].holds(shape) for name, shape in shapes.items() if name in self.inputs)

    def distance(self, shapes: Mapping[str, Shape]) -> int:
        """How far the shapes are from the ones TensorRT tuned this profile for."""
        return sum(abs(element_count(shape) - element_count(self.inputs[name].opt))
                   for name, shape in shapes.items() if name in self.inputs)

    def batch_range(self) -> tuple[int, int]:
        """The batch sizes every input of this profile takes (low > high: none)."""
        ranges = [r for r in self.inputs.values() if r.min]
        return max((r.min[0] for r in ranges), default=1), min((r.max[0] for r in ranges), default=0)


def choose_profile(profiles: Sequence[Profile], shapes: Mapping[str, Shape]) -> int:
    """The index of the profile that takes these input shapes; of several, the
    one tuned closest to them (then the lowest index). InvalidInput, naming the
    tensor and what the profiles take, when none does."""
    fitting = [profile for profile in profiles if profile.holds(shapes)]
    if fitting:
        return min(fitting, key=lambda p: (p.distance(shapes), p.index)).index
    for name, shape in shapes.items():
        ranges = [(p.index, p.inputs[name]) for p in profiles if name in p.inputs]
        if ranges and not any(r.holds(shape) for _, r in ranges):
            takes = "; ".join(f"profile {i} takes {r.describe()}" for i, r in ranges)
            raise InvalidInput(f"input '{name}': shape {list(shape)} fits no optimization profile of the "
                               f"TensorRT engine ({takes})")
    raise InvalidInput(f"the input shapes {_listed(shapes)} fit no single optimization profile of the TensorRT "
                       "engine together")


def _listed(shapes: Mapping[str, Shape]) -> str:
    return ", ".join(f"'{name}' {list(shape)}" for name, shape in shapes.items())


def check_engine(config: ModelConfig, tensors: Sequence[EngineTensor], profiles: Sequence[Profile]) -> None:
    """ModelLoadError, naming the tensor, where the config and the engine disagree."""
    engine = {tensor.name: tensor for tensor in tensors}
    batched = config.max_batch_size > 0
    for kind, configured in (("input", config.inputs), ("output", config.outputs)):
        for spec in configured:
            found = engine.get(spec.name)
            if found is None or found.is_input != (kind == "input"):
                names = [t.name for t in tensors if t.is_input == (kind == "input")]
                raise ModelLoadError(f"{kind} '{spec.name}': the TensorRT engine has no {kind} of that name "
                                     f"(its {kind}s: {names})")
            _check_tensor(kind, spec, found, batched)
    missing = [t.name for t in tensors if t.is_input and config.input(t.name) is None]
    if missing:
        raise ModelLoadError(f"the TensorRT engine takes input(s) {missing}, which the model config does not list")
    if batched:
        _check_batch(config, profiles)


def _check_tensor(kind: str, spec: TensorConfig, found: EngineTensor, batched: bool) -> None:
    if spec.datatype != found.datatype:
        raise ModelLoadError(f"{kind} '{spec.name}': the config says {spec.datatype}, the TensorRT engine has "
                             f"{found.datatype}")
    dims = ((-1,) if batched else ()) + tuple(spec.dims)
    if spec.reshape is not None:
        dims = ((-1,) if batched else ()) + tuple(spec.reshape.shape)
    agree = len(dims) == len(found.shape) and all(a == b or -1 in (a, b) for a, b in zip(dims, found.shape))
    if not agree:
        shown = f"[-1 (batch), {', '.join(map(str, dims[1:]))}]" if batched else str(list(dims))
        raise ModelLoadError(f"{kind} '{spec.name}': the config's shape {shown} does not match the TensorRT "
                             f"engine's {list(found.shape)}")


def _check_batch(config: ModelConfig, profiles: Sequence[Profile]) -> None:
    """The dynamic batcher may form any batch from 1 to max_batch_size, so
    every one of those sizes must fall in some profile."""
    ranges = sorted(profile.batch_range() for profile in profiles)
    largest = max((high for _, high in ranges), default=0)
    if config.max_batch_size > largest:
        raise ModelLoadError(f"max_batch_size {config.max_batch_size} exceeds the largest batch the TensorRT "
                             f"engine's optimization profiles take ({largest})")
    covered = 0
    for low, high in ranges:
        if low > covered + 1:
            break
        covered = max(covered, high)
    if covered < config.max_batch_size:
        raise ModelLoadError(f"batch size {covered + 1} (up to max_batch_size {config.max_batch_size}) falls in no "
                             "optimization profile of the TensorRT engine; build profiles that cover 1..max_batch_size")
