"""Triton's trace settings as ferry's sampler of new traces: checks and counting."""

from __future__ import annotations

import pytest

from workers.telemetry.tracing.control import TraceControl, TraceSettingError


def taken(control: TraceControl, model: str, times: int) -> list[bool]:
    return [control.take(model) for _ in range(times)]


def test_the_startup_share_becomes_one_in_n():
    assert TraceControl(True, 0.25).settings()["trace_rate"] == "4"
    assert TraceControl(True, 0.0).settings()["trace_level"] == ["OFF"]
    assert taken(TraceControl(True, 0.5), "m", 4) == [True, False, True, False]


def test_a_models_own_settings_override_the_servers_one_by_one():
    control = TraceControl(True)
    control.update({"trace_rate": "3"}, model="a")
    assert control.settings("a")["trace_rate"] == "3" and control.settings("b")["trace_rate"] == "1"
    assert taken(control, "a", 3) == [True, False, False]
    assert taken(control, "b", 2) == [True, True]
    control.update({"trace_rate": None}, model="a")
    assert control.settings("a") == control.settings()


def test_the_count_runs_down_and_stops_new_traces():
    control = TraceControl(True)
    control.update({"trace_count": 2})
    assert taken(control, "", 3) == [True, True, False]
    assert control.settings()["trace_count"] == "0"


def test_tracing_off_for_the_process_cannot_be_turned_on():
    control = TraceControl(False)
    assert control.settings()["trace_level"] == ["OFF"] and not control.take("m")
    with pytest.raises(TraceSettingError, match="--trace-exporter"):
        control.update({"trace_level": ["TIMESTAMPS"]})


@pytest.mark.parametrize(("changes", "model", "error"), [
    ({"trace_level": ["TENSORS"]}, "", "TENSORS is not supported"),
    ({"trace_level": ["LOUD"]}, "", "unknown trace level 'LOUD'"),
    ({"trace_level": []}, "", "must be a list of levels"),
    ({"trace_rate": "0"}, "", "'trace_rate' must be 1 or more"),
    ({"trace_rate": "1.5"}, "", "'trace_rate' must be an integer"),
    ({"trace_rate": True}, "", "'trace_rate' must be an integer"),
    ({"trace_count": "-2"}, "", "'trace_count' must be -1"),
    ({"trace_mode": "triton"}, "", "'trace_mode' cannot be changed"),
    ({"trace_rate": None}, "", "cannot be cleared for the whole server"),
    ({"sampling": 1}, "", "unknown trace setting 'sampling'"),
])
def test_bad_settings_are_refused_naming_the_setting_and_change_nothing(changes, model, error):
    control = TraceControl(True)
    before = control.settings()
    with pytest.raises(TraceSettingError, match=error):
        control.update({"trace_count": "5", **changes}, model)
    assert control.settings() == before
