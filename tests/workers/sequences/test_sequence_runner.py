"""A ModelRunner with sequence_batching: control inputs, implicit state,
strategies, idle timeout and bad sequence traffic, on real backends."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from broker.envelope import Request, WireTensor
from workers.errors import SequenceError
from workers.repository.layout import ModelRepository
from workers.runner import ModelRunner
from tests.workers.sequences.accumulator import step, write_accumulator

MODEL_REPO = Path(__file__).resolve().parents[3] / "model_repo"


async def started(repo: Path, name: str = "accumulator") -> ModelRunner:
    runner = ModelRunner(ModelRepository(repo).entry(name), 1)
    await runner.start()
    return runner


def value(outputs: dict[str, np.ndarray], name: str = "SUM") -> object:
    return outputs[name].reshape(-1)[0]


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 8 }"])
async def test_state_carries_from_step_to_step_and_resets_at_start(tmp_path: Path, strategy: str) -> None:
    write_accumulator(tmp_path, strategy=strategy)
    runner = await started(tmp_path)
    try:
        sums = [value(await runner.infer(step(7, x, start=x == 1))) for x in (1, 2, 3)]
        restarted = value(await runner.infer(step(7, 10, start=True, end=True)))
    finally:
        await runner.aclose()
    assert sums == [1, 3, 6]
    assert restarted == 10


async def test_control_inputs_carry_start_end_ready_and_corrid(tmp_path: Path) -> None:
    write_accumulator(tmp_path)
    runner = await started(tmp_path)
    try:
        first = await runner.infer(step(42, 1, start=True))
        last = await runner.infer(step(42, 1, end=True))
    finally:
        await runner.aclose()
    seen = [[value(out, n) for n in ("SEEN_START", "SEEN_END", "SEEN_READY", "SEEN_CORRID")] for out in (first, last)]
    assert seen == [[1, 0, 1, 42], [0, 1, 1, 42]]


async def test_a_string_corrid_reaches_a_string_control(tmp_path: Path) -> None:
    write_accumulator(tmp_path, corrid="TYPE_STRING")
    runner = await started(tmp_path)
    try:
        out = await runner.infer(step("speaker-a", 5, start=True, end=True))
        with pytest.raises(SequenceError, match="sequence_id"):
            await runner.infer(step("", 1, start=True))
    finally:
        await runner.aclose()
    assert value(out, "SEEN_CORRID") == b"speaker-a"


async def test_a_string_id_for_an_integer_corrid_is_refused(tmp_path: Path) -> None:
    write_accumulator(tmp_path)
    runner = await started(tmp_path)
    try:
        with pytest.raises(SequenceError, match="CORRID"):
            await runner.infer(step("abc", 1, start=True))
    finally:
        await runner.aclose()


async def test_initial_state_from_a_data_file(tmp_path: Path) -> None:
    write_accumulator(tmp_path, initial='data_file: "acc.bin"')
    (tmp_path / "accumulator/initial_state").mkdir()
    (tmp_path / "accumulator/initial_state/acc.bin").write_bytes(np.array([100], np.int64).tobytes())
    runner = await started(tmp_path)
    try:
        assert value(await runner.infer(step(1, 5, start=True))) == 105
    finally:
        await runner.aclose()


async def test_concurrent_sequences_share_batches_and_match_running_alone(tmp_path: Path) -> None:
    write_accumulator(tmp_path, strategy="oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 20000 }")
    runner = await started(tmp_path)

    async def sequence(sequence_id: int) -> list[object]:
        steps = [step(sequence_id, sequence_id * x, start=x == 1, end=x == 4) for x in range(1, 5)]
        return [value(await runner.infer(s)) for s in steps]

    try:
        together = await asyncio.gather(*(sequence(i) for i in range(1, 5)))
        batched = runner.sequence_batches
        alone = [await sequence(i) for i in range(1, 5)]
    finally:
        await runner.aclose()
    assert together == alone == [[i, 3 * i, 6 * i, 10 * i] for i in range(1, 5)]
    assert batched < 16, "four concurrent sequences never shared a batch"


async def test_direct_pads_empty_slots_with_ready_false(tmp_path: Path) -> None:
    write_accumulator(tmp_path, strategy="direct { max_queue_delay_microseconds: 0 }")
    runner = await started(tmp_path)
    try:
        await asyncio.gather(runner.infer(step(1, 1, start=True)), runner.infer(step(2, 1, start=True)))
        await runner.infer(step(1, 1, end=True))  # frees slot 0
        out = await runner.infer(step(2, 1))  # slot 1 alone: row 0 is padding
    finally:
        await runner.aclose()
    assert value(out, "ROWS") == 2 and value(out, "SUM") == 2


async def test_a_step_without_start_is_refused(tmp_path: Path) -> None:
    write_accumulator(tmp_path)
    runner = await started(tmp_path)
    try:
        with pytest.raises(SequenceError, match="sequence_start"):
            await runner.infer(step(9, 1))
        with pytest.raises(SequenceError, match="sequence_id"):
            await runner.infer(Request(id="x", model="accumulator", reply_to="r", inputs=step(1, 1).inputs))
    finally:
        await runner.aclose()


async def test_a_step_after_end_is_refused(tmp_path: Path) -> None:
    write_accumulator(tmp_path)
    runner = await started(tmp_path)
    try:
        await runner.infer(step(3, 1, start=True, end=True))
        with pytest.raises(SequenceError, match="ended"):
            await runner.infer(step(3, 1))
    finally:
        await runner.aclose()


async def test_an_idle_sequence_times_out_and_a_late_step_gets_a_clear_error(tmp_path: Path) -> None:
    write_accumulator(tmp_path, idle_us=100_000)
    runner = await started(tmp_path)
    try:
        await runner.infer(step(5, 1, start=True))
        await asyncio.sleep(0.4)
        with pytest.raises(SequenceError, match="timed out after 0.1s idle"):
            await runner.infer(step(5, 1))
        assert value(await runner.infer(step(5, 2, start=True))) == 2
    finally:
        await runner.aclose()


async def test_a_failing_step_fails_alone_and_leaves_state_untouched(tmp_path: Path) -> None:
    write_accumulator(tmp_path, strategy="oldest { max_queue_delay_microseconds: 50000 }")
    runner = await started(tmp_path)
    try:
        await asyncio.gather(runner.infer(step(1, 1, start=True)), runner.infer(step(2, 1, start=True)))
        good, bad = await asyncio.gather(runner.infer(step(1, 1)), runner.infer(step(2, -1)),
                                         return_exceptions=True)
        after = value(await runner.infer(step(2, 5)))
    finally:
        await runner.aclose()
    assert value(good) == 2  # type: ignore[arg-type]
    assert "refuses" in str(bad)
    assert after == 6


async def test_a_multi_row_step_is_refused(tmp_path: Path) -> None:
    write_accumulator(tmp_path)
    runner = await started(tmp_path)
    data = np.ones((2, 1), np.int32)
    request = Request(id="x", model="accumulator", reply_to="r", sequence_id=1, sequence_start=True,
                      inputs=(WireTensor("X", "INT32", (2, 1), data.tobytes()),))
    try:
        with pytest.raises(SequenceError, match="batch size 1"):
            await runner.infer(request)
    finally:
        await runner.aclose()


def gru_step(sequence_id: int, features: np.ndarray, start: bool) -> Request:
    data = features[np.newaxis].astype(np.float32)
    return Request(id=f"{sequence_id}-{start}-{features[0, 0]}", model="stateful_gru", reply_to="r",
                   inputs=(WireTensor("FEATURES", "FP32", data.shape, data.tobytes()),),
                   sequence_id=sequence_id, sequence_start=start)


async def test_the_stateful_gru_batched_across_sequences_equals_each_alone() -> None:
    runner = await started(MODEL_REPO, "stateful_gru")
    rng = np.random.default_rng(3)
    frames = rng.standard_normal((8, 6, 3, 16)).astype(np.float32)  # sequences x steps x frames x features

    async def run(sequence_id: int) -> np.ndarray:
        steps = [gru_step(sequence_id, frames[sequence_id - 1, t], t == 0) for t in range(6)]
        return np.stack([(await runner.infer(s))["LOGITS"][0] for s in steps])

    try:
        interleaved = await asyncio.gather(*(run(i) for i in range(1, 9)))
        batches = runner.sequence_batches
        alone = [await run(i) for i in range(1, 9)]
    finally:
        await runner.aclose()
    assert batches < 48, "the eight sequences never shared a batch"
    np.testing.assert_array_equal(np.stack(interleaved), np.stack(alone))
