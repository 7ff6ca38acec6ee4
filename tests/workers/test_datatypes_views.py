"""encode_array: a numeric array's wire bytes are a view on it, copied only when not contiguous."""

import numpy as np
import pytest

from workers.datatypes import decode_array, encode_array


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float16).reshape(3, 4),
    np.array(2.5, dtype=np.float64),
    np.zeros((0, 4), dtype=np.int32),
    np.array([[True, False]]),
])
def test_a_contiguous_array_is_sent_as_a_view_on_itself(array: np.ndarray):
    datatype, data = encode_array(array)
    assert bytes(data) == array.tobytes()
    if array.size:
        assert np.shares_memory(np.frombuffer(data, np.uint8), array), "copied"
    np.testing.assert_array_equal(decode_array("X", datatype, array.shape, data), array)


def test_a_strided_array_is_copied_into_order():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    datatype, data = encode_array(array)
    assert (datatype, bytes(data)) == ("FP32", np.ascontiguousarray(array).tobytes())
    assert not np.shares_memory(np.frombuffer(data, np.uint8), array)
