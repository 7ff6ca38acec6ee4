"""The speech model driven directly, with this module playing the sequence batcher's part."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import msgpack
import numpy as np
import pytest

from tests.speech.audio import ESPEAK, chunks, silence, speak
from workers.repository.config_file import parse_config_file

pytest.importorskip("pocketsphinx", reason="the speech model needs pocketsphinx 5 (pip install pocketsphinx)")
if ESPEAK is None:
    pytest.skip("the speech tests need espeak-ng to make speech (apt-get install espeak-ng)", allow_module_level=True)

MODEL_DIR = Path(__file__).resolve().parents[2] / "model_repo" / "speech"
CHUNK_MS = 160

# Sentences PocketSphinx's en-us model recognises from espeak-ng's voice, and words that must come out.
SENTENCES = {
    "please open the door": {"open", "door"},
    "i would like a cup of coffee": {"like", "cup", "coffee"},
    "two three four five": {"three", "four", "five"},
}


@dataclass(frozen=True)
class Step:
    corrid: bytes
    chunk: np.ndarray
    start: bool = False
    end: bool = False
    ready: bool = True


@dataclass(frozen=True)
class Row:
    text: str
    is_final: bool
    start_ms: int
    end_ms: int
    audio_ms: int


class Sequencer:
    """Keeps each session's STATE_OUT and hands it back as the next step's STATE_IN."""

    def __init__(self, model: Any, states: dict[bytes, bytes] | None = None) -> None:
        self.model = model
        self.states = dict(states or {})

    def infer(self, steps: list[Step]) -> list[Row]:
        outputs = self.model.infer(self.inputs(steps))
        rows = []
        for index, step in enumerate(steps):
            if step.ready:
                self.states[step.corrid] = outputs["STATE_OUT"][index, 0]
            rows.append(Row(outputs["TEXT"][index, 0].decode(), bool(outputs["IS_FINAL"][index, 0]),
                            *(int(outputs[name][index, 0]) for name in ("START_MS", "END_MS", "AUDIO_MS"))))
        return rows

    def inputs(self, steps: list[Step]) -> dict[str, np.ndarray]:
        def column(values: list[Any], dtype: Any) -> np.ndarray:
            array = np.empty((len(values), 1), dtype=dtype)
            array[:, 0] = values
            return array

        return {
            "AUDIO": np.stack([step.chunk for step in steps]),
            "START": column([int(step.start) for step in steps], np.int32),
            "END": column([int(step.end) for step in steps], np.int32),
            "READY": column([int(step.ready) for step in steps], np.int32),
            "CORRID": column([step.corrid for step in steps], object),
            "STATE_IN": column([b"" if step.start else self.states.get(step.corrid, b"") for step in steps], object),
        }


def session_steps(corrid: bytes, audio: np.ndarray) -> list[Step]:
    pieces = chunks(audio, CHUNK_MS)
    return [Step(corrid, piece, start=index == 0, end=index == len(pieces) - 1) for index, piece in enumerate(pieces)]


def run_alone(model: Any, steps: list[Step]) -> list[Row]:
    sequencer = Sequencer(model)
    return [sequencer.infer([step])[0] for step in steps]


def padded(samples: np.ndarray) -> np.ndarray:
    """A lead-in, and silence up to whole chunks (rows of one batch share a length), too little to end the utterance."""
    audio = np.concatenate([silence(300), samples])
    chunk = len(silence(CHUNK_MS))
    return np.concatenate([audio, np.zeros(-len(audio) % chunk, np.int16)])


def words(text: str) -> set[str]:
    return set(text.split())


def resumed_in_a_fresh_model(make_model: Callable[..., Any], steps: list[Step], split: int, where: str) -> list[Row]:
    """The rows of `steps` when a fresh model takes the session over from its state at `split`,
    which must fall `where` (a step showing words, not final)."""
    first = Sequencer(make_model())
    before = [first.infer([step])[0] for step in steps[:split]]
    assert not before[-1].is_final and before[-1].text, f"the split should fall {where}"
    second = Sequencer(make_model(), first.states)
    return before + [second.infer([step])[0] for step in steps[split:]]


@pytest.fixture(scope="module")
def speech_module() -> Iterator[ModuleType]:
    name = "ferry_test_speech_model"
    spec = importlib.util.spec_from_file_location(name, MODEL_DIR / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there, as under the Python backend
    spec.loader.exec_module(module)
    yield module
    del sys.modules[name]


@pytest.fixture
def make_model(speech_module: ModuleType) -> Iterator[Callable[..., Any]]:
    models = []

    def make(**parameters: str) -> Any:
        model = speech_module.Model()
        model.load(SimpleNamespace(parameters=parameters))
        models.append(model)
        return model

    yield make
    for model in models:
        model.unload()


@pytest.fixture(scope="session")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], np.ndarray]:
    cache = tmp_path_factory.mktemp("espeak")
    return lambda text: padded(speak(text, cache))


@pytest.mark.parametrize("sentence", SENTENCES)
def test_a_streamed_sentence_gives_partials_then_a_final_with_its_key_words(
        make_model: Callable[..., Any], speech: Callable[[str], np.ndarray], sentence: str) -> None:
    audio = speech(sentence)
    rows = run_alone(make_model(), session_steps(b"s", audio))
    *partials, final = rows
    assert any(row.text and not row.is_final for row in partials)
    assert not any(row.is_final for row in partials)
    assert final.is_final and SENTENCES[sentence] <= words(final.text), final.text
    assert 0 < final.start_ms < final.end_ms <= final.audio_ms == len(audio) * 1000 // 16_000


def test_sessions_interleaved_in_one_batch_match_each_session_alone(
        make_model: Callable[..., Any], speech: Callable[[str], np.ndarray]) -> None:
    sessions = {f"s{index}".encode(): session_steps(f"s{index}".encode(), speech(sentence))
                for index, sentence in enumerate(SENTENCES)}
    one_after_another = make_model()
    alone = {corrid: run_alone(one_after_another, steps) for corrid, steps in sessions.items()}
    sequencer = Sequencer(make_model())
    batched: dict[bytes, list[Row]] = {corrid: [] for corrid in sessions}
    for position in range(max(len(steps) for steps in sessions.values())):
        batch = [steps[position] if position < len(steps) else Step(corrid, steps[0].chunk, ready=False)
                 for corrid, steps in sessions.items()]
        for step, row in zip(batch, sequencer.infer(batch)):
            if step.ready:
                batched[step.corrid].append(row)
    assert batched == alone


@pytest.mark.parametrize("split", [0.25, 0.8], ids=["in-the-first-utterance", "in-the-second-utterance"])
def test_a_fresh_model_resumes_a_session_from_its_last_state(
        make_model: Callable[..., Any], speech: Callable[[str], np.ndarray], split: float) -> None:
    audio = np.concatenate([speech("i would like a cup of coffee"), silence(1000), speech("please open the door")])
    steps = session_steps(b"s", audio)
    uninterrupted = run_alone(make_model(), steps)
    finals = [words(row.text) for row in uninterrupted if row.is_final]
    assert len(finals) == 2 and {"cup", "coffee"} <= finals[0] and {"open", "door"} <= finals[1], finals
    assert resumed_in_a_fresh_model(make_model, steps, int(len(steps) * split), "inside an utterance") == uninterrupted


def test_a_session_whose_decoder_was_taken_back_rebuilds_it(
        make_model: Callable[..., Any], speech: Callable[[str], np.ndarray]) -> None:
    steps = session_steps(b"a", speech("i would like a cup of coffee"))
    uninterrupted = run_alone(make_model(), steps)
    sequencer, half = Sequencer(make_model(max_live_decoders="1")), len(steps) // 2
    rows = [sequencer.infer([step])[0] for step in steps[:half]]
    assert not rows[-1].is_final and rows[-1].text, "the split should fall inside the utterance"
    for step in session_steps(b"b", speech("two three four five")):
        sequencer.infer([step])  # takes the only decoder
    rows += [sequencer.infer([step])[0] for step in steps[half:]]
    assert rows == uninterrupted


def test_a_retried_step_gives_the_same_rows_again(
        make_model: Callable[..., Any], speech: Callable[[str], np.ndarray]) -> None:
    steps = session_steps(b"s", speech("two three four five"))
    uninterrupted = run_alone(make_model(), steps)
    sequencer = Sequencer(make_model())
    rows = [sequencer.infer([step])[0] for step in steps[:8]]
    state = sequencer.states[b"s"]
    sequencer.infer([steps[8]])
    sequencer.states[b"s"] = state  # its reply was lost, so the batcher sends the step again
    rows += [sequencer.infer([step])[0] for step in steps[8:]]
    assert rows == uninterrupted


def test_empty_chunks_change_nothing(make_model: Callable[..., Any], speech: Callable[[str], np.ndarray]) -> None:
    steps = session_steps(b"s", speech("please open the door"))
    alone = run_alone(make_model(), steps)
    sequencer, rows = Sequencer(make_model()), []
    for step in steps:
        rows.append(sequencer.infer([step])[0])
        if not step.end:
            assert sequencer.infer([Step(b"s", silence(0))]) == [rows[-1]]
    assert rows == alone


def test_silence_ends_an_utterance_and_its_audio_leaves_the_state(
        make_model: Callable[..., Any], speech: Callable[[str], np.ndarray]) -> None:
    audio = np.concatenate([speech("please open the door"), silence(1000), speech("two three four five")])
    sequencer = Sequencer(make_model())
    rows, sizes = [], []
    for step in session_steps(b"s", audio):
        rows.append(sequencer.infer([step])[0])
        sizes.append(len(sequencer.states[b"s"]))
    finals = [(index, row) for index, row in enumerate(rows) if row.is_final]
    assert [row.text for _, row in finals] == ["please open the door", "two three four five"]
    first_final = finals[0][0]
    assert first_final < len(rows) - 1
    assert sizes[first_final] < 16_000 < max(sizes[:first_final])
    assert finals[0][1].end_ms < finals[1][1].start_ms


def _final_at(rows: list[Row]) -> int:
    """The step of the one final with words (the session's last step is final too, with none)."""
    (index,) = [index for index, row in enumerate(rows) if row.is_final and row.text]
    return index


def test_the_second_pass_is_spread_over_the_steps_after_the_endpoint(
        make_model: Callable[..., Any], speech: Callable[[str], np.ndarray]) -> None:
    """At a pace large enough to hear it all at once, the final comes in the endpoint's own step;
    at the default pace, steps later, with the same words, and the steps between show the first
    pass's words."""
    steps = session_steps(b"s", np.concatenate([speech("i would like a cup of coffee"), silence(2000)]))
    at_once = run_alone(make_model(second_pass_pace="1000"), steps)
    spread = run_alone(make_model(), steps)
    endpoint, final = _final_at(at_once), _final_at(spread)
    assert endpoint + 2 <= final < len(steps) - 1
    assert spread[final].text == at_once[endpoint].text and {"cup", "coffee"} <= words(spread[final].text)
    assert (spread[final].start_ms, spread[final].end_ms) == (at_once[endpoint].start_ms, at_once[endpoint].end_ms)
    between = spread[endpoint:final]
    assert all(not row.is_final and row.text for row in between), between
    assert len({(row.text, row.start_ms, row.end_ms) for row in between}) == 1, between


def test_a_fresh_model_resumes_a_session_in_its_second_pass(
        make_model: Callable[..., Any], speech: Callable[[str], np.ndarray]) -> None:
    steps = session_steps(b"s", np.concatenate([speech("i would like a cup of coffee"), silence(2000)]))
    uninterrupted = run_alone(make_model(), steps)
    endpoint = _final_at(run_alone(make_model(second_pass_pace="1000"), steps))
    assert resumed_in_a_fresh_model(make_model, steps, endpoint + 1, "inside the second pass") == uninterrupted


def test_speech_that_resumes_during_a_second_pass_with_one_decoder_gives_the_same_rows(
        make_model: Callable[..., Any], speech: Callable[[str], np.ndarray]) -> None:
    """The next utterance begins while the last is in its second pass: a step then holds two
    decoders, even where the pool may keep only one."""
    audio = np.concatenate([speech("i would like a cup of coffee"), silence(700), speech("please open the door")])
    steps = session_steps(b"s", audio)
    rows = run_alone(make_model(), steps)
    finals = [words(row.text) for row in rows if row.is_final]
    assert len(finals) == 2 and {"cup", "coffee"} <= finals[0] and {"open", "door"} <= finals[1], finals
    assert run_alone(make_model(max_live_decoders="1"), steps) == rows


def test_padding_rows_are_ignored(make_model: Callable[..., Any], speech: Callable[[str], np.ndarray]) -> None:
    steps = session_steps(b"s", speech("two three four five"))
    alone = run_alone(make_model(), steps)
    sequencer = Sequencer(make_model())
    padding = Step(b"", np.full_like(steps[0].chunk, 12_345), end=True, ready=False)
    sequencer.states[b""] = b"not a state"
    batches = [sequencer.infer([padding, step, padding]) for step in steps]
    assert [rows[1] for rows in batches] == alone
    padding_rows = [row for rows in batches for row in (rows[0], rows[2])]
    assert {(row.text, row.is_final) for row in padding_rows} == {("", False)}


def test_a_chunk_over_max_chunk_samples_is_rejected_naming_audio(make_model: Callable[..., Any]) -> None:
    sequencer = Sequencer(make_model(max_chunk_samples="1600"))
    sequencer.infer([Step(b"s", silence(100), start=True)])
    with pytest.raises(ValueError, match="'AUDIO'.*1601"):
        sequencer.infer([Step(b"s", np.zeros(1601, np.int16))])


def test_a_state_that_is_not_a_session_is_rejected_naming_state_in(make_model: Callable[..., Any]) -> None:
    sequencer = Sequencer(make_model(), {b"s": b"\x93not msgpack"})
    with pytest.raises(ValueError, match="'STATE_IN'"):
        sequencer.infer([Step(b"s", silence(160))])


def test_a_state_whose_second_pass_lies_outside_its_audio_is_rejected_naming_state_in(
        make_model: Callable[..., Any], speech: Callable[[str], np.ndarray]) -> None:
    steps = session_steps(b"s", np.concatenate([speech("please open the door"), silence(2000)]))
    sequencer = Sequencer(make_model())
    for step in steps:
        sequencer.infer([step])
        fields = msgpack.unpackb(sequencer.states[b"s"])
        if fields[-1] is not None:  # an utterance in its second pass
            break
    else:
        pytest.fail("no step left an utterance in its second pass")
    fields[-1][3] = len(fields[-1][2])  # heard: twice as many samples as it has
    sequencer.states[b"s"] = msgpack.packb(fields)
    with pytest.raises(ValueError, match="'STATE_IN'.*second pass: its positions lie outside its audio"):
        sequencer.infer([Step(b"s", silence(160))])


def test_the_config_parses_and_its_parameters_are_the_models_defaults(speech_module: ModuleType) -> None:
    config = parse_config_file(MODEL_DIR / "config.pbtxt")
    assert config.name == "speech"
    assert speech_module.Settings.from_parameters(dict(config.parameters)) == speech_module.Settings()
