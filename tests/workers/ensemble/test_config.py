"""``ensemble_scheduling``: what a config may say, and each error naming its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.ensemble.config import step_errors
from workers.ensemble.plan import Plan
from workers.errors import ConfigError
from workers.repository.config_file import load_config
from workers.repository.layout import ModelRepository
from workers.repository.pbtxt import parse

PATH = Path("/repo/e/config.pbtxt")

HEAD = '''
name: "e"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
'''


def ensemble(steps: str, head: str = HEAD):
    return load_config(PATH, parse(head + f"ensemble_scheduling {{ step [ {steps} ] }}", PATH))


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    maps = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += " " + " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version} {maps} }}'


def error_of(steps: str, head: str = HEAD) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        ensemble(steps, head)
    return caught.value


def test_a_chain_of_steps_is_valid_and_keeps_its_maps():
    config = ensemble(", ".join([step("a", {"X": "IN"}, {"Y": "mid"}), step("b", {"X": "mid"}, {"Y": "OUT"}, 2)]))
    scheduling = config.ensemble_scheduling
    assert scheduling is not None
    assert [s.model_name for s in scheduling.step] == ["a", "b"]
    assert scheduling.step[0].input_map == {"X": "IN"} and scheduling.step[1].output_map == {"Y": "OUT"}
    assert scheduling.step[0].version == "" and scheduling.step[1].version == "2"
    assert config.to_json()["ensemble_scheduling"]["step"][1] == {
        "model_name": "b", "model_version": 2, "input_map": {"X": "mid"}, "output_map": {"Y": "OUT"}}


def test_a_tensor_no_step_produces_names_the_step_and_the_tensor():
    err = error_of(", ".join([step("a", {"X": "IN"}, {"Y": "mid"}), step("b", {"X": "typo"}, {"Y": "OUT"})]))
    assert err.field == "ensemble_scheduling.step[1].input_map"
    assert "'typo'" in str(err) and "model 'b'" in str(err) and str(PATH) in str(err)


def test_a_cycle_between_steps_is_refused():
    steps = [step("a", {"X": "IN", "Z": "back"}, {"Y": "fwd"}), step("b", {"X": "fwd"}, {"Y": "back"}),
             step("c", {"X": "fwd"}, {"Y": "OUT"})]
    err = error_of(", ".join(steps))
    assert err.field == "ensemble_scheduling.step"
    assert "cycle" in str(err) and "step[0] ('a')" in str(err) and "step[1] ('b')" in str(err)


def test_an_ensemble_output_never_produced_is_refused():
    err = error_of(step("a", {"X": "IN"}, {"Y": "elsewhere"}))
    assert err.field == "output[0]" and "'OUT'" in str(err)


def test_a_tensor_produced_twice_is_refused():
    err = error_of(", ".join([step("a", {"X": "IN"}, {"Y": "OUT"}), step("b", {"X": "IN"}, {"Y": "OUT"})]))
    assert err.field == "ensemble_scheduling.step[1].output_map" and "step[0]" in str(err)


def test_a_key_mapped_twice_takes_the_last_as_triton_does_and_an_empty_map_names_its_field():
    twice = '{ model_name: "a" input_map { key: "X" value: "other" } input_map { key: "X" value: "IN" } ' \
            'output_map { key: "Y" value: "OUT" } }'
    scheduling = ensemble(twice).ensemble_scheduling
    assert scheduling is not None and dict(scheduling.step[0].input_map) == {"X": "IN"}
    empty = '{ model_name: "a" output_map { key: "Y" value: "OUT" } }'
    assert error_of(empty).field == "ensemble_scheduling.step[0].input_map"


def test_version_zero_and_an_unknown_step_field_are_refused():
    assert error_of(step("a", {"X": "IN"}, {"Y": "OUT"}, version=-2)).field == "ensemble_scheduling.step[0].model_version"
    odd = '{ model_name: "a" modle_version: 1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "OUT" } }'
    assert error_of(odd).field == "ensemble_scheduling.step[0].modle_version"


def test_platform_and_scheduling_go_together():
    err = error_of(step("a", {"X": "IN"}, {"Y": "OUT"}), HEAD.replace('platform: "ensemble"', 'backend: "python"'))
    assert err.field == "platform"
    with pytest.raises(ConfigError) as caught:
        load_config(PATH, parse(HEAD, PATH))
    assert caught.value.field == "ensemble_scheduling"


def test_an_ensemble_cannot_batch_dynamically():
    # In Triton's schema the two are one oneof, so protobuf refuses the second one read.
    err = error_of(step("a", {"X": "IN"}, {"Y": "OUT"}), HEAD + "dynamic_batching { }")
    assert err.field == "ensemble_scheduling" and 'oneof "scheduling_choice"' in str(err)


def test_latency_keys_are_per_model_and_a_repeated_model_is_numbered():
    config = ensemble(", ".join([step("a", {"X": "IN"}, {"Y": "mid"}), step("a", {"X": "mid"}, {"Y": "OUT"})]))
    assert config.ensemble_scheduling is not None
    plan = Plan.of("e", config.ensemble_scheduling)
    assert [s.latency_key for s in plan.steps] == ["ensemble_step_ms.a", "ensemble_step_ms.a.2"]
    assert [s.number for s in plan.steps] == [1, 2]


# --- checks against the repository's other models ---------------------------

STEP_MODEL = '''
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
'''
MODEL_PY = "class Model:\n    def infer(self, inputs):\n        return {'Y': inputs['X']}\n"


def write_model(repo: Path, name: str, config: str, source: str | None = MODEL_PY) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    if source is not None:
        (repo / name / "1" / "model.py").write_text(source)


def write_ensemble(repo: Path, name: str, steps: str) -> None:
    write_model(repo, name, HEAD.replace('"e"', f'"{name}"') + f"ensemble_scheduling {{ step [ {steps} ] }}",
                source=None)


def test_the_repository_accepts_an_ensemble_with_an_empty_version_directory(tmp_path: Path):
    write_model(tmp_path, "a", STEP_MODEL.format(name="a"))
    write_ensemble(tmp_path, "good", step("a", {"X": "IN"}, {"Y": "OUT"}))
    index = ModelRepository(tmp_path).scan()
    assert sorted(index.entries) == ["a", "good"], index.errors
    entry = index.entries["good"]
    assert entry.versions == (1,) and entry.config.platform == "ensemble" and entry.config.backend == ""


def test_steps_are_checked_against_the_models_the_repository_holds(tmp_path: Path):
    write_model(tmp_path, "a", STEP_MODEL.format(name="a"))
    write_ensemble(tmp_path, "unknown", step("nope", {"X": "IN"}, {"Y": "OUT"}))
    write_ensemble(tmp_path, "bad_input", step("a", {"Q": "IN"}, {"Y": "OUT"}))
    write_ensemble(tmp_path, "bad_output", step("a", {"X": "IN"}, {"Q": "OUT"}))
    write_ensemble(tmp_path, "bad_version", step("a", {"X": "IN"}, {"Y": "OUT"}, version=7))
    write_ensemble(tmp_path, "on_top", step("unknown", {"IN": "IN"}, {"OUT": "OUT"}))
    index = ModelRepository(tmp_path).scan()
    assert sorted(index.entries) == ["a"]
    fields = {name: error.field for name, error in index.errors.items()}
    assert fields == {
        "unknown": "ensemble_scheduling.step[0].model_name",
        "bad_input": "ensemble_scheduling.step[0].input_map",
        "bad_output": "ensemble_scheduling.step[0].output_map",
        "bad_version": "ensemble_scheduling.step[0].model_version",
        "on_top": "ensemble_scheduling.step[0].model_name",  # its step is a rejected ensemble
    }
    assert "unknown model 'nope'" in str(index.errors["unknown"])
    assert str(tmp_path / "unknown" / "config.pbtxt") in str(index.errors["unknown"])
    assert "no input 'Q'" in str(index.errors["bad_input"])


def test_a_step_leaving_a_model_input_unmapped_is_refused(tmp_path: Path):
    two_inputs = STEP_MODEL.format(name="a").replace(
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]',
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "W" data_type: TYPE_FP32 dims: [ 4 ] } ]')
    write_model(tmp_path, "a", two_inputs)
    write_ensemble(tmp_path, "e", step("a", {"X": "IN"}, {"Y": "OUT"}))
    errors = step_errors(ModelRepository(tmp_path).scan().entries)
    assert errors == {}  # already moved to the index's errors by the scan
    index = ModelRepository(tmp_path).scan()
    assert index.errors["e"].field == "ensemble_scheduling.step[0].input_map"
    assert "needs input 'W'" in str(index.errors["e"])
