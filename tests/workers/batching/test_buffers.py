"""BatchBuffers: one copy into memory kept from batch to batch, and never an
output left pointing into memory the next batch rewrites."""

import numpy as np

from workers.batching.buffers import BatchBuffers


def requests(*rows: int, base: float = 0.0) -> list[dict[str, np.ndarray]]:
    return [{"x": np.full((n, 3), base + i, np.float32),
             "s": np.array([[f"{base}-{i}-{r}".encode()] for r in range(n)], dtype=object)}
            for i, n in enumerate(rows)]


def test_merge_concatenates_like_numpy():
    batch = requests(1, 3, 2)
    merged = BatchBuffers(8).merge(batch)
    np.testing.assert_array_equal(merged["x"], np.concatenate([r["x"] for r in batch]))
    assert merged["s"].tolist() == np.concatenate([r["s"] for r in batch]).tolist()


def test_the_same_memory_serves_batch_after_batch():
    buffers = BatchBuffers(8)
    first = buffers.merge(requests(2, 2))["x"]
    second = buffers.merge(requests(1, 2, base=10))["x"]
    assert np.shares_memory(first, second), "the second batch was given fresh memory"
    assert buffers.allocations == 1
    np.testing.assert_array_equal(second[:, 0], [10, 11, 11])


def test_a_buffer_grows_by_powers_of_two_up_to_max_rows():
    shapes = []
    buffers = BatchBuffers(6, allocate=lambda shape, dtype: shapes.append(shape) or np.empty(shape, dtype))
    buffers.merge(requests(1, 2))   # 3 rows -> 4
    buffers.merge(requests(2, 2))   # 4 fit
    buffers.merge(requests(3, 2))   # 5 rows -> 8, capped at 6
    assert shapes == [(4, 3), (6, 3)]


def test_a_new_row_shape_or_dtype_gets_a_new_buffer():
    buffers = BatchBuffers(8)
    buffers.merge(requests(1, 1))
    buffers.merge([{"x": np.zeros((1, 5), np.float32)}, {"x": np.zeros((1, 5), np.float32)}])
    buffers.merge([{"x": np.zeros((1, 5), np.int8)}, {"x": np.zeros((1, 5), np.int8)}])
    assert buffers.allocations == 3


def test_a_single_request_keeps_its_own_arrays_unless_copying_is_asked_for():
    one = requests(2)
    assert BatchBuffers(8).merge(one)["x"] is one[0]["x"]
    copied = BatchBuffers(8, copy_single=True).merge(one)["x"]
    assert not np.shares_memory(copied, one[0]["x"])
    np.testing.assert_array_equal(copied, one[0]["x"])


def test_detach_copies_only_what_shares_a_buffer():
    buffers = BatchBuffers(8)
    merged = buffers.merge(requests(1, 1))
    fresh = merged["x"] * 2
    out = buffers.detach({"echo": merged["x"][1:], "fresh": fresh})
    assert not np.shares_memory(out["echo"], merged["x"])
    assert out["fresh"] is fresh
    buffers.merge(requests(1, 1, base=50))
    np.testing.assert_array_equal(out["echo"], np.full((1, 3), 1, np.float32))
