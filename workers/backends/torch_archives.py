"""Reading PyTorch model files without running code that came in them.

Two formats are served, and both are zip archives:

- TorchScript (``model.pt``, ``torch.jit.save``). libtorch reads its pickles
  with its own unpickler, which builds only tensors and TorchScript types and
  refuses any other global ("Unknown type name 'posix.system'"). A
  ``torch.save`` file (a plain Python pickle) is refused before torch sees it.
- ``torch.export`` programs (``model.pt2``, ``torch.export.save``).
  ``torch.export.load`` is NOT safe on its own: it unpickles tensor subclasses
  and "opaque" constants with ``pickle``, falls back to ``weights_only=False``
  when the sample inputs do not load as plain tensors, evaluates symbolic
  shape strings with ``sympy.sympify`` (``eval``), resolves node targets by
  walking attributes from ``torch`` (``torch.os.system``...), and compiles
  the archive's guard code into Python when the module is built. So the
  archive is read once into memory, checked here entry by entry, and only
  then handed to torch; after loading, every graph node must call an
  operator, never an arbitrary Python callable, and the guards are never
  compiled (``module(check_guards=False)``).

Every refusal is a ``ModelLoadError`` naming the file and the reason.
"""

from __future__ import annotations

import io
import json
import math
import operator
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workers.errors import ModelLoadError

MAX_ARCHIVE_BYTES = 8 << 30

# Archive entries below the archive's root folder that torch.export.save writes
# and ferry lets through; anything else (compiled AOTInductor libraries,
# legacy pickled weights, executorch payloads...) is refused.
_PT2_ENTRIES = re.compile(
    r"archive_format|archive_version|byteorder|\.data/[A-Za-z0-9_.]+"
    r"|models/[A-Za-z0-9_]+\.json|data/sample_inputs/[A-Za-z0-9_]+\.pt"
    r"|data/weights/(weight_[0-9]+|[A-Za-z0-9_]+_weights_config\.json)"
    r"|data/constants/(tensor_[0-9]+|[A-Za-z0-9_]+_constants_config\.json)"
    r"|extra/[A-Za-z0-9_.\-]+"
)
_TARGET_PREFIXES = ("torch.ops.", "_operator.", "math.", "torch.sym_")
# Identifiers a symbolic-shape expression may use: torch's sympy functions,
# the sympy classes torch prints, and Symbol's assumptions.
_SYMPY_NAMES = frozenset({
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "IntTrueDiv", "FloatTrueDiv", "LShift", "RShift", "IsNonOverlappingAndDenseIndicator",
    "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat", "FloatPow", "PowByNatural",
    "Identity", "OpaqueUnaryFn_sqrt", "BitwiseFn_bitwise_and", "BitwiseFn_bitwise_or",
    "Symbol", "Integer", "Rational", "Float", "Max", "Min", "Abs", "Pow", "Mul", "Add", "Piecewise",
    "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "floor", "ceiling", "sqrt",
    "oo", "zoo", "nan", "true", "false", "True", "False",
    "positive", "negative", "integer", "real", "nonnegative", "nonpositive", "finite", "zero",
})
_SYMBOL_NAME = re.compile(r"'[A-Za-z][A-Za-z0-9_]*'")
_SYMPY_TEXT = re.compile(r"[A-Za-z0-9_+\-*/%(),.<>=!&|~ ]*")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SAFE_PY_TARGETS = frozenset({
    operator.getitem, operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
    operator.mod, operator.pow, operator.neg, operator.pos, operator.abs, operator.eq, operator.ne,
    operator.lt, operator.le, operator.gt, operator.ge, operator.and_, operator.or_, operator.xor,
    operator.not_, operator.invert, operator.lshift, operator.rshift,
    math.ceil, math.floor, math.sqrt, math.trunc,
})


def read_archive(path: Path) -> bytes:
    """The file's bytes, read once so the check and the load see the same bytes."""
    try:
        size = path.stat().st_size
        if size > MAX_ARCHIVE_BYTES:
            raise ModelLoadError(f"{path}: {size} bytes, over ferry's {MAX_ARCHIVE_BYTES} byte limit")
        return path.read_bytes()
    except OSError as err:
        raise ModelLoadError(f"{path}: cannot read it: {err.strerror or err}") from None


def check_torchscript(path: Path, data: bytes) -> None:
    """Refuse anything that is not a TorchScript archive, before torch reads it."""
    names = _zip_names(path, data, "a TorchScript archive (torch.jit.save)")
    roots = {name.split("/", 1)[0] for name in names}
    if len(roots) != 1:
        raise ModelLoadError(f"{path}: a TorchScript archive has one root folder, this has {sorted(roots)}")
    root = roots.pop()
    if f"{root}/constants.pkl" not in names or not any(n.startswith(f"{root}/code/") for n in names):
        raise ModelLoadError(
            f"{path}: not TorchScript (no code/ or constants.pkl); this looks like a torch.save pickle, "
            "which ferry never loads because unpickling can run code. Save the model with "
            "torch.jit.script(model).save(...) or torch.export.save(...) as model.pt2")


def check_exported_program(path: Path, data: bytes) -> None:
    """Refuse a ``torch.export`` archive that would make torch unpickle or eval."""
    names = _zip_names(path, data, "a torch.export archive (torch.export.save)")
    archive = zipfile.ZipFile(io.BytesIO(data))
    root = _pt2_root(path, names)
    inner = [name[len(root):] for name in names]
    for name in inner:
        if not _PT2_ENTRIES.fullmatch(name):
            raise ModelLoadError(f"{path}: entry '{root}{name}' is not part of a plain torch.export archive "
                                 "(pickled weights or compiled code are refused)")
    if archive.read(f"{root}archive_format").strip() != b"pt2":
        raise ModelLoadError(f"{path}: archive_format is not 'pt2'")
    models = [n[len("models/"):-len(".json")] for n in inner if n.startswith("models/")]
    if models != ["model"]:
        raise ModelLoadError(f"{path}: expected one exported program named 'model', found {models}")
    for config in ("data/weights/model_weights_config.json", "data/constants/model_constants_config.json"):
        _check_payload_config(path, _read_json(path, archive, root + config), config)
    _check_sample_inputs(path, archive.read(f"{root}data/sample_inputs/model.pt"))
    _check_program_json(path, _read_json(path, archive, f"{root}models/model.json"))


def check_graph_targets(path: Path, graph_modules: Iterator[Any]) -> None:
    """Every node of every graph calls a torch operator or a plain arithmetic function."""
    import torch

    operators = (torch._ops.OpOverload, torch._ops.OpOverloadPacket, torch._ops.HigherOrderOperator)
    for module in graph_modules:
        for node in module.graph.nodes:
            if node.op in ("call_method", "call_module"):
                raise ModelLoadError(f"{path}: node '{node.name}' is a {node.op}, which exported programs "
                                     "do not need; refused")
            if node.op != "call_function":
                continue
            target = node.target
            if isinstance(target, operators) or target in _SAFE_PY_TARGETS or _is_sym_function(torch, target):
                continue
            raise ModelLoadError(f"{path}: node '{node.name}' calls {target!r}, which is not a torch operator; refused")


def _is_sym_function(torch: Any, target: Any) -> bool:
    name = getattr(target, "__name__", "")
    return name.startswith("sym_") and getattr(torch, name, None) is target


def _zip_names(path: Path, data: bytes, what: str) -> list[str]:
    try:
        return zipfile.ZipFile(io.BytesIO(data)).namelist()
    except zipfile.BadZipFile:
        raise ModelLoadError(f"{path}: not a zip archive, so not {what}") from None


def _pt2_root(path: Path, names: list[str]) -> str:
    roots = {name.split("/", 1)[0] for name in names}
    if len(roots) != 1 or not all("/" in name for name in names):
        raise ModelLoadError(f"{path}: a torch.export archive has one root folder, this has {sorted(roots)}")
    return f"{roots.pop()}/"


def _read_json(path: Path, archive: zipfile.ZipFile, name: str) -> Any:
    try:
        return json.loads(archive.read(name))
    except KeyError:
        raise ModelLoadError(f"{path}: missing '{name}'") from None
    except ValueError as err:
        raise ModelLoadError(f"{path}: '{name}' is not valid JSON: {err}") from None


def _check_payload_config(path: Path, config: Any, name: str) -> None:
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise ModelLoadError(f"{path}: '{name}' has no config object")
    for fqn, payload in entries.items():
        if not isinstance(payload, dict) or payload.get("use_pickle") is not False:
            raise ModelLoadError(f"{path}: '{fqn}' in '{name}' is stored as a pickle, which ferry never loads")
        if not str(payload.get("path_name", "")).startswith(("weight_", "tensor_")):
            raise ModelLoadError(f"{path}: '{fqn}' in '{name}' is not a plain tensor "
                                 f"({payload.get('path_name')!r}); custom objects are refused")


def _check_sample_inputs(path: Path, data: bytes) -> None:
    # torch retries these with weights_only=False when the safe load fails.
    import torch

    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as err:  # noqa: BLE001 - any failure here means torch would fall back to pickle
        raise ModelLoadError(f"{path}: its sample inputs do not load as plain tensors "
                             f"({type(err).__name__}), and torch would unpickle them; refused") from None


def _check_program_json(path: Path, program: Any) -> None:
    for key, value in _walk(program):
        if key == "expr_str":
            _check_sympy_text(path, value)
        elif key == "target" and isinstance(value, str) and not _safe_target(value):
            raise ModelLoadError(f"{path}: a node's target '{value}' is not a torch operator; refused")


def _walk(value: Any) -> Iterator[tuple[str, Any]]:
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            for key, item in current.items():
                yield key, item
                stack.append(item)
        elif isinstance(current, list):
            stack.extend(current)


def _safe_target(target: str) -> bool:
    return target.startswith(_TARGET_PREFIXES) and "__" not in target


def _check_sympy_text(path: Path, text: Any) -> None:
    if not isinstance(text, str):
        raise ModelLoadError(f"{path}: a symbolic shape is {type(text).__name__}, not text")
    bare = _SYMBOL_NAME.sub("s0", text)
    if not _SYMPY_TEXT.fullmatch(bare) or "__" in bare or re.search(r"\.\s*[A-Za-z_]", bare):
        raise ModelLoadError(f"{path}: symbolic shape {text[:80]!r} is not a plain expression; refused")
    for word in _IDENTIFIER.findall(bare):
        if word not in _SYMPY_NAMES and not re.fullmatch(r"[a-z]+[0-9]+", word):
            raise ModelLoadError(f"{path}: symbolic shape {text[:80]!r} uses '{word}'; refused")
