"""Triton's classification extension: top K classes as "score:index[:label]" strings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from broker.envelope import WireTensor
from gateway.classification import MAX_CLASSES, LabelFiles, classify
from gateway.errors import InvalidRequest
from gateway.v2_codec import parse_infer_request
from workers.datatypes import DATATYPES, decode_array, encode_array, numpy_dtype


def wire(array: np.ndarray, name: str = "PROBS") -> WireTensor:
    datatype, data = encode_array(array)
    return WireTensor(name, datatype, tuple(array.shape), data)


def strings(tensor: WireTensor) -> list[list[str]] | list[str]:
    assert tensor.datatype == "BYTES"
    return decode_array(tensor.name, "BYTES", tensor.shape, tensor.data).astype(str).tolist()


def test_a_batched_output_is_classified_row_by_row_with_labels():
    probs = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]], np.float32)
    top = classify(wire(probs), 2, batched=True, labels=("cat", "dog", "emu"))
    assert top.shape == (2, 2)
    assert strings(top) == [["0.700000:1:dog", "0.200000:2:emu"], ["0.500000:0:cat", "0.250000:1:dog"]]


def test_without_labels_or_beyond_them_the_label_is_left_off():
    top = classify(wire(np.array([1.5, 3.0, 2.0], np.float64)), 3, batched=False, labels=("a",))
    assert top.shape == (3,)
    assert strings(top) == ["3.000000:1", "2.000000:2", "1.500000:0:a"]


def test_k_beyond_the_classes_gives_them_all_and_ties_keep_the_lower_index_first():
    top = classify(wire(np.array([[2, 7, 7, -1]], np.int16)), 10, batched=True)
    assert top.shape == (1, 4)
    assert strings(top) == [["7:1", "7:2", "2:0", "-1:3"]]


def test_an_unbatched_output_of_several_dimensions_is_one_set_of_classes():
    top = classify(wire(np.array([[1, 9], [5, 3]], np.uint8)), 2, batched=False)
    assert top.shape == (2,) and strings(top) == ["9:1", "5:2"]


@pytest.mark.parametrize("datatype", sorted(set(DATATYPES) - {
    "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"}))
def test_other_datatypes_cannot_be_classified(datatype):
    if datatype == "BYTES":
        tensor = WireTensor("PROBS", "BYTES", (1,), b"\x01\x00\x00\x00a")
    else:
        tensor = wire(np.zeros((1, 2), numpy_dtype(datatype)))
    with pytest.raises(InvalidRequest, match=f"class result not available for output 'PROBS' due to "
                                              f"unsupported type '{datatype}'"):
        classify(tensor, 1, batched=True)


def test_too_many_classes_per_row_is_refused():
    with pytest.raises(InvalidRequest, match="classification output tensor too large"):
        classify(wire(np.zeros((1, MAX_CLASSES + 1), np.uint8)), 1, batched=True)


@pytest.mark.parametrize(("value", "error"), [
    (True, "Unable to set 'classification'"), (-1, "Unable to set 'classification'"),
    ("3", "Unable to set 'classification'"), (2.5, "Unable to set 'classification'"),
])
def test_a_classification_that_is_not_a_count_is_refused(value, error):
    with pytest.raises(InvalidRequest, match=f"requested output 'PROBS': {error}"):
        parse_infer_request(request_body({"classification": value}), None)


def test_classification_and_shared_memory_cannot_be_asked_of_one_output():
    parameters = {"classification": 2, "shared_memory_region": "r", "shared_memory_byte_size": 8}
    with pytest.raises(InvalidRequest, match="can't set both 'shared_memory_region' and 'classification'"):
        parse_infer_request(request_body(parameters), None)


def test_a_count_is_kept_for_rendering():
    (output,) = parse_infer_request(request_body({"classification": 3}), None).outputs
    assert output.classification == 3


def request_body(parameters: dict) -> bytes:
    return orjson.dumps({"inputs": [{"name": "IMAGE", "datatype": "FP32", "shape": [1], "data": [0.0]}],
                         "outputs": [{"name": "PROBS", "parameters": parameters}]})


def test_label_files_are_read_again_when_they_change(tmp_path: Path):
    files = LabelFiles()
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    assert files.labels(tmp_path, "labels.txt") == ("cat", "dog")
    (tmp_path / "labels.txt").write_text("cat\ndog\nemu\n")
    assert files.labels(tmp_path, "labels.txt") == ("cat", "dog", "emu")
    assert files.labels(tmp_path, "") == ()
