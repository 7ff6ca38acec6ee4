"""Python-backend instances in processes of their own, driven through a real
ModelRunner: GIL-bound instances computing at once, errors as in process,
a killed instance process replaced, and no process left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from broker.envelope import Request, WireTensor
from tests.models import COUNTDOWN, COUNTDOWN_CONFIG, write_python_model
from tests.procfs import child_pids
from workers.errors import ExecutionError, InvalidInput, ModelLoadError
from workers.repository.layout import ModelRepository
from workers.runner import ModelRunner
from workers.responder import error_of
from workers.warmup import warm_up

ROOT = Path(__file__).resolve().parents[3]
STUB = "workers.backends.python_stub"

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT64 dims: [ 1 ] }}, {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }},
         {{ name: "SPAN" data_type: TYPE_FP64 dims: [ 2 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
parameters [ {{ key: "FERRY_INSTANCE_PROCESS" value: {{ string_value: "{mode}" }} }} ]
"""

# X > 0: sum(range(X)) in one C call, which holds the GIL throughout, as PocketSphinx does.
# X == -1: note the pid in a file and sleep, so a test can kill the process mid-request.
# X == -2..-5: fail in one of the ways a model can.
MODEL = """
import os
import time

import numpy as np

MARK = {mark!r}


class Model:
    def infer(self, inputs):
        x = int(inputs["X"].reshape(-1)[0])
        if x == -1:
            with open(MARK, "w") as mark:
                mark.write(str(os.getpid()))
            time.sleep(60)
        if x == -2:
            raise ValueError("X must not be -2")
        if x == -3:
            raise RuntimeError("boom")
        if x == -4:
            return [1, 2]
        if x == -5:
            return {{"PID": np.array([0])}}
        start = time.monotonic()
        sum(range(max(x, 0)))
        end = time.monotonic()
        return {{"Y": np.array([2 * x]), "PID": np.array([os.getpid()]), "SPAN": np.array([start, end])}}
"""


def request(x: int) -> Request:
    return Request(id=f"r{x}", model="m", reply_to="r",
                   inputs=(WireTensor("X", "INT64", (1,), np.array([x], dtype="<i8").tobytes()),))


async def started(tmp_path: Path, count: int = 1, mode: str = "yes", source: str = MODEL,
                  config: str = CONFIG, name: str = "m") -> ModelRunner:
    write_python_model(tmp_path / "repo", name, source.format(mark=str(tmp_path / "mark")),
                       config.format(name=name, count=count, mode=mode))
    runner = ModelRunner(ModelRepository(tmp_path / "repo").entry(name), 1)
    try:
        await runner.start()
    except BaseException:
        await runner.aclose()
        raise
    return runner


def stub_children(pid: int | None = None) -> set[int]:
    """The live instance processes whose parent is ``pid`` (this process)."""
    return {child for child in child_pids(pid) if alive(child) and STUB in _cmdline(child)}


def alive(pid: int) -> bool:
    """Running: not gone, and not a zombie waiting for its parent (or init) to reap it. A
    process whose main thread is a zombie is still running while another thread is exiting."""
    try:
        return any(_state(task) != "Z" for task in Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False


def _state(task: Path) -> str:
    try:
        return (task / "stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "Z"  # gone since the listing


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def wait_until(condition: object, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture(autouse=True)
def no_instance_left() -> Iterator[None]:
    yield
    assert stub_children() == set(), "an instance process outlived its runner"


def gil_seconds_work(seconds: float) -> int:
    """How large an X makes sum(range(X)) take about ``seconds`` here."""
    took = min(_timed(lambda: sum(range(1_000_000))) for _ in range(3))
    return int(1_000_000 * seconds / took)


def _timed(call: object) -> float:
    began = time.perf_counter()
    call()  # type: ignore[operator]
    return time.perf_counter() - began


async def test_two_gil_bound_instances_compute_at_once_in_two_processes(tmp_path: Path) -> None:
    """Each request holds the GIL for ~0.4 s. Were they computed one after
    the other (through anything that serialises the instances), the second
    would start computing only once the first had ended; in two processes
    they run side by side (on one busy core too, time-sliced by the kernel),
    so the shorter interval lies mostly inside the longer. (Not that they end
    together: on a loaded machine one may get twice the CPU of the other.)"""
    x = gil_seconds_work(0.4)
    runner = await started(tmp_path, count=2)
    try:
        a, b = await asyncio.gather(runner.infer(request(x)), runner.infer(request(x)))
    finally:
        await runner.aclose()
    (start_a, end_a), (start_b, end_b) = a["SPAN"], b["SPAN"]
    pids = {int(a["PID"][0]), int(b["PID"][0])}
    assert len(pids) == 2 and os.getpid() not in pids
    overlap = min(end_a, end_b) - max(start_a, start_b)
    assert overlap > min(end_a - start_a, end_b - start_b) / 2, (a["SPAN"], b["SPAN"])
    assert not any(alive(pid) for pid in pids)


async def test_an_instance_process_killed_mid_request_fails_that_request_and_is_replaced(tmp_path: Path) -> None:
    runner = await started(tmp_path)
    try:
        first = await runner.infer(request(1))
        in_flight = asyncio.create_task(runner.infer(request(-1)))
        mark = tmp_path / "mark"
        await asyncio.to_thread(wait_until, lambda: mark.exists() and mark.read_text())
        killed = int(mark.read_text())
        assert killed == int(first["PID"][0])
        os.kill(killed, signal.SIGKILL)
        with pytest.raises(ExecutionError) as failed:
            await asyncio.wait_for(in_flight, 30)
        after = await runner.infer(request(3))
    finally:
        await runner.aclose()
    assert f"(pid {killed}) was killed by SIGKILL while computing the request" in str(failed.value)
    assert "model 'm' instance 0" in str(failed.value)
    assert int(after["Y"][0]) == 6 and int(after["PID"][0]) != killed
    assert not alive(killed) and not alive(int(after["PID"][0]))


async def test_an_instance_process_that_died_between_requests_is_replaced_before_the_next(tmp_path: Path) -> None:
    runner = await started(tmp_path)
    try:
        pid = int((await runner.infer(request(1)))["PID"][0])
        os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(wait_until, lambda: not alive(pid))
        after = await runner.infer(request(2))
    finally:
        await runner.aclose()
    assert int(after["Y"][0]) == 4 and int(after["PID"][0]) != pid


async def test_model_errors_come_back_exactly_as_in_process(tmp_path: Path) -> None:
    seen: dict[str, list[tuple[type, str, str]]] = {}
    for mode in ("yes", "no"):
        runner = await started(tmp_path / mode, mode=mode)
        try:
            seen[mode] = [_failure(await _raised(runner.infer(request(x)))) for x in (-2, -3, -4, -5)]
        finally:
            await runner.aclose()
    assert seen["yes"] == seen["no"]
    assert [kind for kind, _, _ in seen["yes"]] == [InvalidInput, ExecutionError, ExecutionError, ExecutionError]
    assert seen["yes"][0][2] == "model 'm': X must not be -2"
    assert seen["yes"][1][2] == "RuntimeError: boom"


async def _raised(call: object) -> BaseException:
    try:
        await call  # type: ignore[misc]
    except Exception as exc:
        return exc
    raise AssertionError("no error")


def _failure(exc: BaseException) -> tuple[type, str, str]:
    error = error_of(exc)
    return type(error), error.code, str(error)


async def test_a_model_that_fails_to_load_fails_the_same_way_and_leaves_no_process(tmp_path: Path) -> None:
    messages = {}
    for mode in ("yes", "no"):
        with pytest.raises(ModelLoadError) as failed:
            await started(tmp_path / mode, mode=mode, source="raise ImportError('no such thing')\n")
        messages[mode] = str(failed.value).replace(str(tmp_path / mode), "<repo>")
    assert messages["yes"] == messages["no"]
    assert "import failed: ImportError('no such thing')" in messages["yes"]


async def test_a_bad_instance_process_setting_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="FERRY_INSTANCE_PROCESS must be 'yes' or 'no', not 'maybe'"):
        await started(tmp_path, mode="maybe")


async def test_a_decoupled_model_streams_its_responses_from_its_process(tmp_path: Path) -> None:
    config = COUNTDOWN_CONFIG + 'parameters [ { key: "FERRY_INSTANCE_PROCESS" value: { string_value: "yes" } } ]\n'
    write_python_model(tmp_path, "countdown", COUNTDOWN, config)
    runner = ModelRunner(ModelRepository(tmp_path).entry("countdown"), 1)
    await runner.start()

    def countdown(n: int) -> Request:
        return Request(id=f"c{n}", model="countdown", reply_to="r",
                       inputs=(WireTensor("N", "INT32", (1,), np.array([n], dtype="<i4").tobytes()),))
    try:
        words = [out["WORD"].tolist() async for out in runner.infer_stream(countdown(3))]
        with pytest.raises(InvalidInput, match="N must not be negative"):
            [_ async for _ in runner.infer_stream(countdown(-1))]
        none = [out async for out in runner.infer_stream(countdown(0))]
        again = [int(out["OUT"][0]) async for out in runner.infer_stream(countdown(2))]
    finally:
        await runner.aclose()
    assert words == [[b"t-3"], [b"t-2"], [b"t-1"]]
    assert none == [] and again == [2, 1]


WORKER = """
import asyncio, sys
from pathlib import Path
from workers.repository.layout import ModelRepository
from workers.runner import ModelRunner

async def main():
    runner = ModelRunner(ModelRepository(Path(sys.argv[1])).entry("m"), 1)
    await runner.start()
    print("ready", flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


def test_a_sigkilled_workers_instance_processes_die_with_it(tmp_path: Path) -> None:
    write_python_model(tmp_path / "repo", "m", MODEL.format(mark=""), CONFIG.format(name="m", count=2, mode="yes"))
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / "repo")], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert worker.stdout is not None
        assert b"ready\n" in iter(worker.stdout.readline, b"")  # after the log lines
        instances = stub_children(worker.pid)
        assert len(instances) == 2
    finally:
        worker.kill()
        worker.wait()
        assert worker.stdout is not None
        worker.stdout.close()
    wait_until(lambda: not any(alive(pid) for pid in instances))


BATCHED_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "X" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT64 dims: [ 1 ] }}, {{ name: "ROWS" data_type: TYPE_INT64 dims: [ 1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 500000 preferred_batch_size: [ 3 ] }}
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""
# Kills its process whenever X == 13 is in its batch.
BATCHED_MODEL = """
import os

import numpy as np


class Model:
    def infer(self, inputs):
        x = inputs["X"]
        if (x == 13).any():
            os._exit(3)
        return {{"Y": x * 2, "ROWS": np.full(x.shape, len(x))}}
"""


async def test_in_a_batch_that_kills_its_process_only_the_culprit_fails(tmp_path: Path) -> None:
    runner = await started(tmp_path, source=BATCHED_MODEL, config=BATCHED_CONFIG)

    def batched(x: int) -> Request:
        return Request(id=f"b{x}", model="m", reply_to="r",
                       inputs=(WireTensor("X", "INT64", (1, 1), np.array([[x]], dtype="<i8").tobytes()),))
    try:
        results = await asyncio.gather(*(runner.infer(batched(x)) for x in (1, 13, 2)), return_exceptions=True)
        after = await runner.infer(batched(5))
    finally:
        await runner.aclose()
    good = [r for r in results if isinstance(r, dict)]
    assert [int(r["Y"][0, 0]) for r in good] == [2, 4]
    assert all(int(r["ROWS"][0, 0]) == 1 for r in good)  # each run again alone, on a new process
    assert isinstance(results[1], ExecutionError) and "exited with code 3 while computing" in str(results[1])
    assert int(after["Y"][0, 0]) == 10


# Counts its calls: a warmup run in its process shows in the first request's count.
COUNTING_MODEL = """
import os

import numpy as np


class Model:
    calls = 0

    def load(self, context):
        self.factor = int(context.parameters["factor"])

    def infer(self, inputs):
        Model.calls += 1
        return {{"Y": inputs["X"] * self.factor, "PID": np.array([os.getpid()]), "SPAN": np.array([Model.calls, 0.0])}}
"""
WARMUP = """model_warmup [ {{ name: "zeros" count: 3 inputs {{ key: "X" value: {{ data_type: TYPE_INT64 dims: [ 1 ]
                                                                          zero_data: true }} }} }} ]
"""


async def test_warmup_and_parameters_reach_the_instance_process(tmp_path: Path) -> None:
    factor = '{{ key: "factor" value: {{ string_value: "3" }} }}, '
    config = CONFIG.replace("parameters [ ", f"parameters [ {factor}") + WARMUP
    runner = await started(tmp_path, source=COUNTING_MODEL, config=config)
    try:
        await warm_up(runner)
        first = await runner.infer(request(7))
    finally:
        await runner.aclose()
    assert int(first["Y"][0]) == 21 and int(first["SPAN"][0]) == 4
    assert int(first["PID"][0]) != os.getpid()
