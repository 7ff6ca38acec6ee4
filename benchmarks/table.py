"""A plain-text table: fixed-width columns under a header line, a missing value shown as "-"."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    width: int
    spec: str = ""      # how a value is formatted: ".1f", ".0%"
    align: str = ">"    # "<" for text

    def cell(self, value: object) -> str:
        return f"{formatted(value, self.spec):{self.align}{self.width}}"


def formatted(value: object, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def header(columns: Sequence[Column]) -> str:
    return " ".join(f"{column.header:{column.align}{column.width}}" for column in columns)


def line(columns: Sequence[Column], values: Sequence[object]) -> str:
    return " ".join(column.cell(value) for column, value in zip(columns, values, strict=True))


def print_table(columns: Sequence[Column], rows: Iterable[Sequence[object]]) -> None:
    print(header(columns))
    for values in rows:
        print(line(columns, values))
