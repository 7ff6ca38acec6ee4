import pytest

from workers.decimal_text import ascii_int


@pytest.mark.parametrize("text, expected", [
    ("0", 0), ("7", 7), ("007", 7), ("999999999999999999", 999_999_999_999_999_999),
    ("", None), ("²", None), ("１", None), ("١", None), (" 12", None), ("+12", None), ("1_2", None),
    ("-1", None), ("1.0", None), ("1000000000000000000", None),
])
def test_only_ascii_digits_within_an_int64_are_numbers(text, expected):
    assert ascii_int(text) == expected


def test_fewer_digits_may_be_allowed():
    assert ascii_int("1234", max_digits=3) is None and ascii_int("123", max_digits=3) == 123
