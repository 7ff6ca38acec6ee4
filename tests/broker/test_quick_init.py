"""``broker.quick_init``: the cheaper ``__init__`` builds what the dataclass's own would,
and the class stays frozen."""

from __future__ import annotations

import dataclasses

import pytest

from broker.envelope import Request, Response, WireTensor
from broker.quick_init import quick_init


@quick_init
@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    name: str
    count: int = 3
    tags: dict[str, str] = dataclasses.field(default_factory=dict)


def test_fields_defaults_and_factories_are_as_the_dataclass_makes_them():
    first, second = Sample("a"), Sample("b", 5, {"k": "v"})
    assert (first.name, first.count, first.tags) == ("a", 3, {})
    assert (second.name, second.count, second.tags) == ("b", 5, {"k": "v"})
    assert Sample("c").tags is not Sample("c").tags  # a fresh default each time
    assert Sample(name="d", tags={"x": "y"}) == Sample("d", 3, {"x": "y"})
    with pytest.raises(TypeError):
        Sample()  # type: ignore[call-arg]


def test_the_class_stays_frozen_and_replace_still_works():
    sample = Sample("a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.count = 4  # type: ignore[misc]
    assert dataclasses.replace(sample, count=9) == Sample("a", 9)
    assert repr(sample) == "Sample(name='a', count=3, tags={})"


def test_post_init_runs():
    @quick_init
    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        size: int

        def __post_init__(self) -> None:
            if self.size < 0:
                raise ValueError("negative")

    assert Checked(1).size == 1
    with pytest.raises(ValueError, match="negative"):
        Checked(-1)


def test_only_frozen_slotted_dataclasses_are_taken():
    with pytest.raises(TypeError, match="not a frozen, slotted dataclass"):
        quick_init(dataclasses.dataclass(slots=True)(type("Loose", (), {"__annotations__": {"x": int}})))
    with pytest.raises(TypeError, match="not a frozen, slotted dataclass"):
        quick_init(dataclasses.dataclass(frozen=True)(type("Unslotted", (), {"__annotations__": {"x": int}})))


def test_the_envelope_classes_build_alike():
    tensor = WireTensor("x", "FP32", (1,), b"\0" * 4)
    request = Request("id", "m", (tensor,), "reply", priority=2)
    assert request.parameters == {} and request.priority == 2 and request.inputs == (tensor,)
    assert Request("id", "m", (), "r").trace is not Request("id", "m", (), "r").trace
    assert Response("id", "m").final is True
    assert hash(tensor) == hash(WireTensor("x", "FP32", (1,), b"\0" * 4))
