"""Frames between a worker and an instance process, over a real socket pair."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tests.models import write_python_model
from tests.workers.sequences.accumulator import config as accumulator_config
from workers.backends.base import ModelContext
from workers.backends.python_wire import Channel, ChannelClosed, context_body, context_from, error_body, error_from
from workers.errors import ExecutionError, InvalidInput, ModelLoadError, TensorError
from workers.repository.layout import ModelRepository
from workers.responder import error_of

MODEL_REPO = Path(__file__).resolve().parents[3] / "model_repo"


@pytest.fixture
def pair() -> Iterator[tuple[Channel, Channel]]:
    a, b = socket.socketpair()
    left, right = Channel(a), Channel(b)
    yield left, right
    left.close()
    right.close()


ARRAYS = {
    "fp32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "fp16": np.array([[1.5, -2.0]], dtype=np.float16),
    "bf16": np.array([1.0, 2.5], dtype=ml_dtypes.bfloat16),
    "bool": np.array([[True], [False]]),
    "int64_big_endian": np.array([1, 2, 3], dtype=">i8"),
    "uint8_empty": np.zeros((0, 5), dtype=np.uint8),
    "scalar": np.array(7, dtype=np.int32),
    "strided": np.arange(20, dtype=np.int32).reshape(4, 5)[:, ::2],
    "bytes": np.array([[b"a"], [b""], [b"\x00\xff"]], dtype=object),
    "str_objects": np.array(["h\u00e9", "x"], dtype=object),
    "unicode": np.array(["ab", "c"]),
}


@pytest.mark.parametrize("name", ARRAYS)
def test_an_array_crosses_with_its_dtype_shape_and_values(pair: tuple[Channel, Channel], name: str) -> None:
    left, right = pair
    left.send({"op": "infer"}, {name: ARRAYS[name]})
    header, tensors = right.receive()
    got, sent = tensors[name], ARRAYS[name]
    assert header == {"op": "infer"}
    assert got.dtype == sent.dtype and got.shape == sent.shape
    assert [type(x) for x in got.reshape(-1).tolist()] == [type(x) for x in sent.reshape(-1).tolist()]
    np.testing.assert_array_equal(got, sent)


def test_a_large_tensor_crosses_whole_while_the_other_end_reads(pair: tuple[Channel, Channel]) -> None:
    left, right = pair
    big = np.random.default_rng(0).random((2048, 1024))  # 16 MiB, more than a socket buffer holds
    sender = threading.Thread(target=left.send, args=({}, {"X": big}))
    sender.start()
    _, tensors = right.receive()
    sender.join()
    np.testing.assert_array_equal(tensors["X"], big)
    tensors["X"][0, 0] = 1.0  # the model may write to its inputs, as it may in process


def test_a_closed_end_is_channel_closed_not_a_hang(pair: tuple[Channel, Channel]) -> None:
    left, right = pair
    left.close()
    with pytest.raises(ChannelClosed):
        right.receive()
    with pytest.raises(ChannelClosed):
        right.send({}, {"X": np.zeros(4)})


def test_waiting_past_a_timeout_is_channel_closed(pair: tuple[Channel, Channel]) -> None:
    with pytest.raises(ChannelClosed):
        pair[1].receive(timeout_s=0.05)


def test_an_object_that_cannot_cross_fails_before_anything_is_sent(pair: tuple[Channel, Channel]) -> None:
    left, right = pair
    structured = np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])
    with pytest.raises(ExecutionError, match="'S'.*cannot leave"):
        left.send({}, {"S": structured})
    left.send({"next": 1})
    assert right.receive() == ({"next": 1}, {})


@pytest.mark.parametrize("raised", [
    InvalidInput("model 'm': X must be positive"),
    TensorError("tensor 'X': bad bytes"),
    ModelLoadError("model.py: import failed: SyntaxError('x')"),
    RuntimeError("poisoned input 13"),
    KeyError("X"),
])
def test_an_error_comes_back_as_error_of_would_have_made_it_in_process(raised: Exception) -> None:
    crossed = error_from(error_body(raised))
    expected = error_of(raised)
    assert (type(crossed), crossed.code, str(crossed)) == (type(expected), expected.code, str(expected))


RICH_CONFIG = """name: "rich"
backend: "python"
max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] },
        { name: "S" data_type: TYPE_STRING dims: [ 1 ] optional: true } ]
output [ { name: "B" data_type: TYPE_FP32 dims: [ 2 ] reshape: { shape: [ 1, 2 ] } } ]
dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 100 priority_levels: 2
                   default_priority_level: 1 default_queue_policy { default_timeout_microseconds: 5 } }
version_policy { all { } }
instance_group [ { count: 1 kind: KIND_CPU }, { name: "g" count: 2 kind: KIND_GPU gpus: [ 0 ] } ]
model_warmup [ { name: "w" batch_size: 2
  inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 2 ] random_data: true } } } ]
response_cache { enable: true }
parameters [ { key: "FERRY_INSTANCE_PROCESS" value: { string_value: "yes" } } ]
"""


def test_a_model_context_crosses_whole(tmp_path: Path) -> None:
    write_python_model(tmp_path, "accumulator", "class Model: pass\n",
                       accumulator_config(corrid="TYPE_STRING", instances=2, parameters={"k": "v"}))
    write_python_model(tmp_path, "rich", "class Model: pass\n", RICH_CONFIG)
    entries = [*(ModelRepository(tmp_path).entry(name) for name in ("accumulator", "rich")),
               *(ModelRepository(MODEL_REPO).entry(name) for name in ("speech", "text_stats", "add_sub"))]
    for entry in entries:
        group = entry.config.instance_groups[-1]
        context = ModelContext(entry.name, 1, entry.path / "1", entry.model_file(1), entry.config, group, 1)
        assert context_from(context_body(context)) == context, entry.name


def test_a_frame_that_does_not_parse_is_channel_closed() -> None:
    raw, theirs = socket.socketpair()
    channel = Channel(theirs)
    body = b"\xc1"  # a byte msgpack never uses
    raw.sendall(len(body).to_bytes(4, "little") + body)
    with pytest.raises(ChannelClosed, match="does not parse"):
        channel.receive()
    raw.close()
    channel.close()
