"""Small PyTorch and OpenVINO models for tests, written into a repository.

    write_torchscript(repo, name, module, config_text)
    write_exported(repo, name, module, example_args, config_text, filename="model.pt2")
    write_onnx_from_torch(path, module, example_args, input_names, output_names)
    write_openvino_ir(repo, name, onnx_path, config_text)
    framework_config(name, backend_line, max_batch_size, inputs, outputs, extra="")

Weights come from fixed seeds. Every module here batches along dimension 0.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from tests.models import generator


class Affine(nn.Module):
    """``(relu(x @ W + b) * scale, x.sum(1))``: two inputs, two outputs."""

    def __init__(self, features: int = 4, classes: int = 3) -> None:
        super().__init__()
        torch.manual_seed(1234)
        self.linear = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(self.linear(x)) * scale, x.sum(dim=1, keepdim=True)


class Classifier(nn.Module):
    """A dict result: ``{"probs": softmax, "label": argmax (INT64)}``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(99)
        self.linear = nn.Linear(4, 5)

    def forward(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.linear(features)
        return {"label": logits.argmax(dim=1, keepdim=True), "probs": torch.softmax(logits, dim=1)}


class Types(nn.Module):
    """FP16, BF16, INT64 and BOOL in and out, one op each."""

    def forward(self, half: torch.Tensor, brain: torch.Tensor, count: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return half * 2, brain + 1, count + 1, ~mask


class BatchRows(nn.Module):
    """``x * 2`` and, for each row, the size of the batch it was computed in."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.full((x.shape[0], 1), x.shape[0], dtype=torch.int32)
        return x * 2, rows


class SmallCnn(nn.Module):
    """Two convolutions, pooling and a linear layer over [3, 16, 16] images."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Linear(16, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(image))


def version_dir(repo: Path, name: str, config_text: str) -> Path:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(config_text)
    return repo / name / "1"


def write_torchscript(repo: Path, name: str, module: nn.Module, config_text: str) -> Path:
    path = version_dir(repo, name, config_text) / "model.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch 2.10+ deprecates TorchScript
        warnings.simplefilter("ignore", DeprecationWarning)  # as torch 2.11 does
        torch.jit.script(module.eval()).save(str(path))
    return path


def write_exported(repo: Path, name: str, module: nn.Module, example_args: tuple[torch.Tensor, ...],
                   config_text: str, filename: str = "model.pt2") -> Path:
    """An exported program whose first dimension (the batch) is dynamic."""
    path = version_dir(repo, name, config_text) / filename
    batch = torch.export.Dim("batch", min=1, max=64)
    shapes = tuple({0: batch} for _ in example_args)
    torch.export.save(torch.export.export(module.eval(), example_args, dynamic_shapes=shapes), str(path))
    return path


def write_onnx_from_torch(path: Path, module: nn.Module, example_args: tuple[torch.Tensor, ...],
                          input_names: Sequence[str], output_names: Sequence[str], dynamic_batch: bool = True) -> Path:
    """The module as ONNX (TorchScript-based exporter, which needs no onnxscript)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    axes = {name: {0: "batch"} for name in (*input_names, *output_names)} if dynamic_batch else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module.eval(), example_args, str(path), dynamo=False, opset_version=17,
                          input_names=list(input_names), output_names=list(output_names), dynamic_axes=axes)
    return path


def write_openvino_ir(repo: Path, name: str, onnx_path: Path, config_text: str) -> Path:
    import openvino as ov

    path = version_dir(repo, name, config_text) / "model.xml"
    ov.save_model(ov.convert_model(str(onnx_path)), str(path), compress_to_fp16=False)
    return path


def write_onnx_for_openvino(repo: Path, name: str, onnx_path: Path, config_text: str) -> Path:
    path = version_dir(repo, name, config_text) / "model.onnx"
    shutil.copy(onnx_path, path)
    return path


def framework_config(name: str, backend_line: str, max_batch_size: int, inputs: Sequence[tuple[str, str, list[int]]],
                     outputs: Sequence[tuple[str, str, list[int]]], extra: str = "") -> str:
    """``inputs``/``outputs``: (name, TYPE_*, dims) each."""
    tensor = generator().tensor_config
    return generator().model_config(name, backend_line, max_batch_size,
                                    [tensor(*spec) for spec in inputs], [tensor(*spec) for spec in outputs], extra)
