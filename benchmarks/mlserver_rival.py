"""MLServer (Seldon's V2 server) serving the same ONNX model, for a side-by-side run.

MLServer has no ONNX runtime of its own, so its model folder gets a small custom runtime
(``OnnxModel`` below, written into the folder): one ``onnxruntime.InferenceSession``, inputs
decoded with MLServer's ``NumpyCodec``. Its adaptive batching is set to the ferry model's
dynamic batching (the same largest batch and delay), and everything else is MLServer's
default (``parallel_workers`` 1: the model runs in a worker process of its own). MLServer
runs from a Python environment of its own (``--mlserver PYTHON``), never ferry's: its
pins (FastAPI, pydantic, protobuf) are not ferry's.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from benchmarks.server import HOST, RunningServer, free_port, stop_process, wait_ready

RUNTIME = '''
import onnxruntime
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxModel(MLModel):
    async def load(self) -> bool:
        path = await get_model_uri(self._settings)
        self._session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        self._output = self._session.get_outputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {item.name: NumpyCodec.decode_input(item) for item in payload.inputs}
        (result,) = self._session.run([self._output], feeds)
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output(self._output, result)])
'''


def version(python: Path) -> str | None:
    """MLServer's version in the environment of ``python``; None when it is not installed there."""
    found = subprocess.run([str(python), "-c", "import mlserver; print(mlserver.__version__)"],
                           capture_output=True, text=True, check=False)
    return found.stdout.strip() if found.returncode == 0 else None


def write_folder(folder: Path, model: str, onnx_file: Path, max_batch_size: int, max_delay_s: float,
                 http_port: int) -> None:
    """An MLServer model folder: server settings, the model's settings, the runtime and the file."""
    (folder / model).mkdir(parents=True)
    shutil.copy(onnx_file, folder / model / "model.onnx")
    (folder / "onnx_runtime.py").write_text(RUNTIME)
    server = {"host": HOST, "http_port": http_port, "grpc_port": free_port(), "metrics_port": free_port(),
              "load_models_at_startup": True}
    (folder / "settings.json").write_text(json.dumps(server))
    settings = {"name": model, "implementation": "onnx_runtime.OnnxModel", "parameters": {"uri": "./model.onnx"},
                "max_batch_size": max_batch_size, "max_batch_time": max_delay_s}
    (folder / model / "model-settings.json").write_text(json.dumps(settings))


@contextlib.contextmanager
def mlserver_server(python: Path, folder: Path, model: str, onnx_file: Path, log_path: Path, *,
                    max_batch_size: int, max_delay_s: float,
                    ready_timeout_s: float = 120.0) -> Iterator[RunningServer]:
    """``mlserver start`` on a folder for ``onnx_file`` until the block ends, then SIGTERM it."""
    port = free_port()
    write_folder(folder, model, onnx_file, max_batch_size, max_delay_s, port)
    with log_path.open("wb") as log:
        process = subprocess.Popen([str(python.parent / "mlserver"), "start", str(folder)], cwd=folder,
                                   stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(process, port, log_path, ready_timeout_s, name="mlserver start")
        yield RunningServer(HOST, port, process.pid, log_path)
    finally:
        stop_process(process)
