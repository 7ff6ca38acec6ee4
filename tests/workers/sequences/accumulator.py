"""A stateful Python model for sequence tests, and requests for it.

``accumulator``: X (INT32 [1]) is added to the implicit state ACC; SUM is the
new total. It echoes its control inputs (START, END, READY, CORRID) and how
many rows its batch had, so tests can see what the sequence batcher fed it,
and the pid of the process that ran it: the instance process, whose parent is
the worker.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from broker.envelope import Request, WireTensor
from tests.models import write_python_model

SOURCE = """
import os

import numpy as np


class Model:
    def infer(self, inputs):
        rows = inputs["X"].shape[0]
        total = inputs["ACC_IN"] + inputs["X"].astype(np.int64)
        if (inputs["X"] == -1).any():
            raise ValueError("X is -1, which this model refuses")
        return {
            "SUM": total, "ACC_OUT": total,
            "SEEN_START": inputs["START"], "SEEN_END": inputs["END"], "SEEN_READY": inputs["READY"],
            "SEEN_CORRID": inputs["CORRID"], "ROWS": np.full((rows, 1), rows, dtype=np.int32),
            "PID": np.full((rows, 1), os.getpid(), dtype=np.int64),
        }
"""

_ids = itertools.count()


def config(name: str = "accumulator", strategy: str = "direct { }", max_batch_size: int = 4,
           idle_us: int = 5_000_000, instances: int = 1, corrid: str = "TYPE_UINT64",
           initial: str = "zero_data: true", parameters: dict[str, str] | None = None) -> str:
    outputs = ", ".join(f'{{ name: "{n}" data_type: TYPE_INT32 dims: [ 1 ] }}'
                        for n in ("SEEN_START", "SEEN_END", "SEEN_READY", "ROWS"))
    corrid_type = "TYPE_STRING" if corrid == "TYPE_STRING" else corrid
    flags = "".join(f'{{ name: "{n}" control [ {{ kind: CONTROL_SEQUENCE_{n} int32_false_true: [ 0, 1 ] }} ] }}, '
                    for n in ("START", "END", "READY"))
    return f"""name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "SUM" data_type: TYPE_INT64 dims: [ 1 ] }}, {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }},
         {outputs},
         {{ name: "SEEN_CORRID" data_type: {corrid_type} dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  control_input [ {flags}{{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }} ]
  state [ {{ input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT64 dims: [ 1 ]
            initial_state: {{ data_type: TYPE_INT64 dims: [ 1 ] {initial} name: "start" }} }} ]
}}
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
{_parameters(parameters or dict())}"""


def _parameters(values: dict[str, str]) -> str:
    entries = ", ".join(f'{{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in values.items())
    return f"parameters [ {entries} ]\n" if entries else ""


def write_accumulator(repo: Path, name: str = "accumulator", **options: object) -> None:
    write_python_model(repo, name, SOURCE, config(name, **options))  # type: ignore[arg-type]


def step(sequence_id: int | str, x: int, start: bool = False, end: bool = False, model: str = "accumulator",
         batched: bool = True, request_id: str | None = None) -> Request:
    shape = (1, 1) if batched else (1,)
    data = np.full(shape, x, dtype=np.int32)
    return Request(id=request_id or f"step-{next(_ids)}", model=model, reply_to="r",
                   inputs=(WireTensor("X", "INT32", shape, data.tobytes()),),
                   sequence_id=sequence_id, sequence_start=start, sequence_end=end)
