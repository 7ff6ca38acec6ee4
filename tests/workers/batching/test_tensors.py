import numpy as np
import pytest

from workers.batching.tensors import batch_key, merge, rows_of, split
from workers.errors import ExecutionError


def test_merge_then_split_returns_each_request_exactly():
    requests = [
        {"x": np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) + 100 * rows,
         "s": np.array([[f"r{rows}-{i}".encode()] for i in range(rows)], dtype=object)}
        for rows in (1, 3, 2)
    ]
    merged = merge(requests)
    assert merged["x"].shape == (6, 3)
    parts = split(merged, [rows_of(r) for r in requests])
    for original, part in zip(requests, parts):
        np.testing.assert_array_equal(part["x"], original["x"])
        assert part["s"].tolist() == original["s"].tolist()


def test_batch_key_separates_shapes_and_dtypes():
    a = {"x": np.zeros((1, 4), np.float32)}
    assert batch_key(a) == batch_key({"x": np.zeros((5, 4), np.float32)})
    assert batch_key(a) != batch_key({"x": np.zeros((1, 5), np.float32)})
    assert batch_key(a) != batch_key({"x": np.zeros((1, 4), np.float64)})


@pytest.mark.parametrize("shape", [(5, 2), (), (7,)])
def test_split_rejects_outputs_that_lost_the_batch_dimension(shape):
    with pytest.raises(ExecutionError, match="output 'y'"):
        split({"y": np.zeros(shape)}, [2, 4])
