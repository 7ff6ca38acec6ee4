"""model_warmup is validated when the config loads; samples become tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workers.datatypes import decode_array
from workers.errors import ConfigError
from workers.repository.config_file import load_config
from workers.repository.pbtxt import parse
from workers.warmup import sample_tensors

BASE = """name: "m" max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "S" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "B" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def _config(warmup: str, path: Path = Path("m/config.pbtxt")):
    return load_config(path, parse(BASE + warmup, str(path)))


def test_samples_turn_into_batched_tensors(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "a.bin").write_bytes(np.arange(6, dtype=np.float32).tobytes())
    config = _config("""model_warmup [ { name: "file" batch_size: 3 count: 2
      inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "a.bin" } }
      inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 1 ] zero_data: true } } } ]""")
    sample = config.model_warmup[0]
    assert sample.runs == 2 and config.to_json()["model_warmup"][0]["inputs"]["A"]["input_data_file"] == "a.bin"
    tensors = {t.name: t for t in sample_tensors(config, sample, tmp_path)}
    assert tensors["A"].shape == (3, 2) and tensors["S"].shape == (3, 1)
    np.testing.assert_array_equal(decode_array("A", "FP32", (3, 2), tensors["A"].data),
                                  np.arange(6, dtype=np.float32).reshape(3, 2))


@pytest.mark.parametrize(("warmup", "field", "reason"), [
    ('model_warmup [ { name: "w" inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 2 ] } } } ]',
     "model_warmup[0].inputs.A", "exactly one of"),
    ('model_warmup [ { name: "w" inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 2 ] '
     'input_data_file: "../../secret" } } } ]', "model_warmup[0].inputs.A", "warmup/ directory"),
    ('model_warmup [ { name: "w" inputs { key: "A" value: { data_type: TYPE_NOPE dims: [ 2 ] zero_data: true } } } ]',
     "model_warmup[0].inputs.A.data_type", ""),
    ('model_warmup [ { name: "w" } ]', "model_warmup[0].inputs", ""),
])
def test_bad_samples_are_config_errors_naming_the_field(warmup: str, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _config(warmup)
    assert refused.value.field == field and reason in str(refused.value), refused.value


def test_a_missing_data_file_names_the_input(tmp_path: Path) -> None:
    config = _config('model_warmup [ { name: "w" batch_size: 1 inputs { key: "A" value: '
                     '{ data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "none.bin" } } } ]')
    with pytest.raises(ValueError, match="input 'A': cannot read warmup/none.bin"):
        sample_tensors(config, config.model_warmup[0], tmp_path)
