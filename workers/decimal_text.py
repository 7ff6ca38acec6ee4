"""Whole numbers as a client writes them: ASCII digits only.

``str.isdigit()`` also takes '²' (which ``int()`` refuses) and '１' or '١'
(which ``int()`` reads as 1), and ``int()`` alone also takes ' 12 ', '+12'
and '1_2'. A bound on the digits keeps the value inside an int64.
"""

from __future__ import annotations

INT64_DIGITS = 18


def ascii_int(text: str, max_digits: int = INT64_DIGITS) -> int | None:
    """``text`` as a non-negative integer, or None when it is not one."""
    if not text or len(text) > max_digits or not (text.isascii() and text.isdigit()):
        return None
    return int(text)
