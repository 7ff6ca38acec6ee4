"""The ``Prefer`` request header (RFC 7240)."""

from __future__ import annotations

from collections.abc import Iterable

RESPOND_ASYNC = "respond-async"


def preference_names(values: Iterable[str]) -> set[str]:
    """The preference tokens named in every ``Prefer`` header, lower-cased:
    ``Prefer: return=minimal; foo="a,b", Respond-Async`` names ``return`` and
    ``respond-async``."""
    names: set[str] = set()
    for value in values:
        for preference in _split_outside_quotes(value, ","):
            token = _split_outside_quotes(preference, ";")[0].split("=", 1)[0].strip().lower()
            if token:
                names.add(token)
    return names


def prefers_async(values: Iterable[str]) -> bool:
    return RESPOND_ASYNC in preference_names(values)


def _split_outside_quotes(text: str, separator: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return parts
