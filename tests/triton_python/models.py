"""Models written as Triton's Python-backend documentation writes them (``TritonPythonModel``,
``import triton_python_backend_utils as pb_utils``), each written afresh for these tests."""

from __future__ import annotations

from pathlib import Path

ADD_SUB = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = config = json.loads(args["model_config"])
        self.dtypes = {
            name: pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, name)["data_type"])
            for name in ("OUTPUT0", "OUTPUT1")
        }
        self.name = args["model_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if in_0.shape != in_1.shape:
                error = pb_utils.TritonError("INPUT0 and INPUT1 differ in shape", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            out_0 = pb_utils.Tensor("OUTPUT0", (in_0 + in_1).astype(self.dtypes["OUTPUT0"]))
            out_1 = pb_utils.Tensor("OUTPUT1", (in_0 - in_1).astype(self.dtypes["OUTPUT1"]))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_0, out_1]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info(f"{self.name} finalized")
'''
ADD_SUB_CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
         {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 1000 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters [ {{ key: "FERRY_INSTANCE_PROCESS" value: {{ string_value: "{process}" }} }} ]
'''

# Decoupled: for IN = [a, b, c] it answers three times, OUT = a then b then c, IDX the position,
# from a thread of its own after execute() has returned, then sends the final flag.
REPEAT = '''
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
            sender = request.get_response_sender()
            thread = threading.Thread(target=self.answer, args=(values, sender))
            thread.start()
            self.threads.append(thread)
        return None

    def answer(self, values, sender):
        for index, value in enumerate(values):
            time.sleep(0.01)
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32)),
            ]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
'''
REPEAT_CONFIG = '''
name: "repeat"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
'''

# Auto-complete: the config names the model and its backend and nothing else.
AUTO = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        auto_complete_model_config.add_input({"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]})
        auto_complete_model_config.add_output({"name": "LENGTH", "data_type": "TYPE_INT32", "dims": [1]})
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            lengths = np.array([[len(t[0])] for t in texts], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LENGTH", lengths)]))
        return responses
'''
AUTO_CONFIG = '''
name: "auto"
backend: "python"
'''

# BLS: doubles X by calling the model named in DOUBLER (an add_sub: X + X) until it passes LIMIT,
# looping over the other model as Triton's BLS examples loop; answers the value and the calls made.
BLS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.callee = "{callee}"

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "X").as_numpy().reshape(-1)[0]
            limit = pb_utils.get_input_tensor_by_name(request, "LIMIT").as_numpy().reshape(-1)[0]
            calls = 0
            error = None
            while value <= limit:
                row = np.full((1, 4), value, dtype=np.float32)
                call = pb_utils.InferenceRequest(
                    model_name=self.callee, requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.Tensor("INPUT0", row), pb_utils.Tensor("INPUT1", row)])
                answer = call.exec()
                calls += 1
                if answer.has_error():
                    error = pb_utils.TritonError("the doubler failed: " + answer.error().message())
                    break
                value = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()[0, 0]
            if error is not None:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("Y", np.array([value], dtype=np.float32)),
                pb_utils.Tensor("CALLS", np.array([calls], dtype=np.int32)),
            ]))
        return responses
'''
BLS_CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }}, {{ name: "LIMIT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }}, {{ name: "CALLS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
parameters [ {{ key: "FERRY_INSTANCE_PROCESS" value: {{ string_value: "{process}" }} }} ]
'''


# BLS with async_exec: an async execute that asks the callee for every row of X at once and sums
# what comes back, as Triton's async BLS example gathers its requests.
FANOUT = '''
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "X").as_numpy().reshape(-1)
            calls = [pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0"],
                                               inputs=[pb_utils.Tensor("INPUT0", np.full((1, 4), v, np.float32)),
                                                       pb_utils.Tensor("INPUT1", np.full((1, 4), v, np.float32))])
                     for v in values]
            answers = await asyncio.gather(*(call.async_exec() for call in calls))
            total = sum(pb_utils.get_output_tensor_by_name(a, "OUTPUT0").as_numpy()[0, 0] for a in answers)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", np.array([total], np.float32))]))
        return responses
'''
FANOUT_CONFIG = '''
name: "fanout"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters [ { key: "FERRY_INSTANCE_PROCESS" value: { string_value: "{process}" } } ]
'''


def write(repo: Path, name: str, source: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1/model.py").write_text(source)
    (repo / name / "config.pbtxt").write_text(config)


def write_all(repo: Path, process: str = "yes") -> None:
    """add_sub, repeat, auto, and bls and fanout (calling add_sub) in ``repo``; ``process``:
    whether each instance runs in a process of its own."""
    write(repo, "add_sub", ADD_SUB, ADD_SUB_CONFIG.format(name="add_sub", process=process))
    write(repo, "repeat", REPEAT, REPEAT_CONFIG)
    write(repo, "auto", AUTO, AUTO_CONFIG)
    write(repo, "bls", BLS.replace("{callee}", "add_sub"), BLS_CONFIG.format(name="bls", process=process))
    write(repo, "fanout", FANOUT, FANOUT_CONFIG.replace("{process}", process))
