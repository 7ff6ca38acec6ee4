"""Triton's classification extension: a requested output with
``parameters.classification: K`` comes back as its top K classes instead of its
values, each the string ``"score:index"``, or ``"score:index:label"`` where the
output's ``label_filename`` gives the class a label.

As in Triton, a batched model's output is classified row by row (shape
``[batch, K]``), an unbatched one as a whole (shape ``[K]``); K larger than the
number of classes gives them all; scores are printed as C's ``%f`` does for
floats and as integers otherwise; integer and FP32/FP64 outputs can be
classified, others not. Ties keep the lower index first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from broker.envelope import WireTensor
from gateway.catalog import ModelCatalog
from gateway.errors import InvalidRequest
from gateway.v2_codec import Classify, RequestedOutput
from workers.datatypes import decode_array, join_bytes

MAX_CLASSES = 1_000_000  # per row; Triton's bound on the work one request may ask for
_CLASSIFIABLE = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"})


def classify(tensor: WireTensor, k: int, batched: bool, labels: Sequence[str] = ()) -> WireTensor:
    """``tensor`` as its top ``k`` classes per row, a BYTES tensor."""
    if tensor.datatype not in _CLASSIFIABLE:
        raise InvalidRequest(f"class result not available for output '{tensor.name}' due to unsupported "
                             f"type '{tensor.datatype}'")
    array = decode_array(tensor.name, tensor.datatype, tensor.shape, tensor.data)
    rows = array.reshape(array.shape[0], -1) if batched and array.ndim > 0 else array.reshape(1, -1)
    if rows.shape[1] > MAX_CLASSES:
        raise InvalidRequest(f"classification output tensor too large: output '{tensor.name}' has "
                             f"{rows.shape[1]} classes per row, more than {MAX_CLASSES}")
    count = min(k, rows.shape[1])
    floating = tensor.datatype.startswith("FP")
    texts: list[object] = []
    for row in rows:
        # Stable on the negated scores: of equal scores, the lower index comes first.
        order = np.argsort(-row.astype(np.float64), kind="stable")[:count]
        for index in order.tolist():
            score = f"{row[index]:f}" if floating else str(int(row[index]))
            label = labels[index] if index < len(labels) else ""
            texts.append(f"{score}:{index}:{label}" if label else f"{score}:{index}")
    shape = (rows.shape[0], count) if batched and array.ndim > 0 else (count,)
    return WireTensor(name=tensor.name, datatype="BYTES", shape=shape, data=join_bytes(texts))


class LabelFiles:
    """The labels of a model's outputs, one per line of its ``label_filename``
    (read once per file version: the file's size and modification time)."""

    def __init__(self) -> None:
        self._cache: dict[Path, tuple[tuple[int, int], tuple[str, ...]]] = {}

    def labels(self, model_dir: Path, filename: str) -> tuple[str, ...]:
        """The config check found the file at load; one removed since is a server fault (500)."""
        if not filename:
            return ()
        path = model_dir / filename
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        lines = tuple(path.read_text(encoding="utf-8", errors="replace").splitlines())
        self._cache[path] = (stamp, lines)
        return lines


class Classifiers:
    """What ranks a model's outputs, for a request that asked for classes."""

    def __init__(self, catalog: ModelCatalog) -> None:
        self._catalog = catalog
        self._labels = LabelFiles()

    def for_request(self, model: str, outputs: Sequence[RequestedOutput]) -> Classify | None:
        if not any(output.classification for output in outputs):
            return None
        entry = self._catalog.entry(model)
        batched = entry.config.max_batch_size > 0

        def top_classes(tensor: WireTensor, k: int) -> WireTensor:
            spec = entry.config.output(tensor.name)
            labels = self._labels.labels(entry.path, spec.label_filename) if spec is not None else ()
            return classify(tensor, k, batched, labels)
        return top_classes
