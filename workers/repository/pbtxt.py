"""Triton's ``config.pbtxt``, read as Triton reads it: protobuf's text format
against Triton's own ``ModelConfig`` schema (``model_config.proto``, which
``tritonclient`` ships compiled as ``tritonclient.grpc.model_config_pb2``).

So a field the schema lacks, an enum value it does not define
(``data_type: FP32`` for ``TYPE_FP32``) or a value of the wrong type is
refused exactly where Triton refuses it. A load request's ``config``
override is JSON, read with protobuf's JSON rules as Triton does (a quoted
integer such as ``"max_batch_size": "16"`` is an integer).

What comes out is plain values for ``workers.repository.config`` to validate:
a message is a ``dict`` of the fields that are set, a repeated field a
``list``, an enum its name, and a map a list of ``{"key": ..., "value": ...}``
entries in key order (``map_entries`` turns one into a ``dict``). Only
``ConfigError`` escapes, naming the file, the line:column where there is one,
and the field.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2

from workers.errors import ConfigError

# protobuf's messages: "2:1 : Message type ... has no field named "foo"." and the like.
_POSITION = re.compile(r"^(?P<line>\d+):(?P<column>\d+) : (?:'[^\n]*': )?(?P<message>.*)$", re.DOTALL)
_INDEX = re.compile(r"\[\d+\]$")


def parse(text: str, path: str) -> dict[str, Any]:
    """Parse pbtxt ``text``; ``path`` only names the file in errors."""
    config = model_config_pb2.ModelConfig()
    try:
        with warnings.catch_warnings():
            # protobuf warns of an escape it does not know ("\\o") and then reads it as it is.
            warnings.simplefilter("error", DeprecationWarning)
            text_format.Parse(text, config)
    except text_format.ParseError as err:
        raise _text_error(path, text, str(err)) from None
    except (DeprecationWarning, ValueError) as err:  # a bad escape or a string that is not UTF-8
        raise ConfigError(path, "(config)", f"cannot read a string: {err}") from None
    return plain(config)


def parse_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(str(path), "(file)", f"not valid UTF-8 at byte {err.start}") from None
    except OSError as err:
        raise ConfigError(str(path), "(file)", f"cannot read: {err.strerror or err}") from None
    return parse(text, str(path))


def parse_json(body: str | bytes, path: str) -> dict[str, Any]:
    """A config as Triton's JSON (protobuf's JSON mapping); ``path`` names it in errors."""
    config = model_config_pb2.ModelConfig()
    try:
        json_format.Parse(body, config)
    except json_format.ParseError as err:
        message = str(err).split("\n")[0]
        raise ConfigError(path, _json_field(message), message) from None
    return plain(config)


def plain(message: Message) -> dict[str, Any]:
    """The fields of ``message`` that are set, as plain values."""
    return {field.name: _field_value(field, value) for field, value in message.ListFields()}


def map_entries(value: Any, example: str, twice: str = "") -> Any:
    """Protobuf map entries as ``plain`` gives them, ``[{key, value}]``, as
    ``{key: value}`` (anything else passes through for the validator to
    judge); ValueError naming the entry that is not ``example``-shaped, and,
    when ``twice`` is set, for a key given twice (``twice`` formatted with
    ``key``)."""
    if not isinstance(value, list):
        return value
    result: dict[Any, Any] = {}
    for index, entry in enumerate(value):
        if not isinstance(entry, dict) or set(entry) != {"key", "value"}:
            raise ValueError(f"entry {index} must look like {example}")
        if twice and entry["key"] in result:
            raise ValueError(twice.format(key=entry["key"]))
        result[entry["key"]] = entry["value"]
    return result


def _field_value(field: FieldDescriptor, value: Any) -> Any:
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        inner = entry.fields_by_name["value"]
        return [{"key": key, "value": _single(inner, value[key])} for key in sorted(value)]
    if field.is_repeated:
        return [_single(field, item) for item in value]
    return _single(field, value)


def _single(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return plain(value)
    if field.enum_type is not None:
        return field.enum_type.values_by_number[value].name
    return value


def _text_error(path: str, text: str, message: str) -> ConfigError:
    """protobuf's message, with the dotted field it was reading (protobuf names only a type)."""
    match = _POSITION.match(message)
    if match is None:
        return ConfigError(path, "(config)", message)
    line, column = int(match["line"]), int(match["column"])
    detail = match["message"].rstrip(".")
    unknown = re.search(r'(?:has no field named |^Field )"([^"]+)"', detail)
    field = field_at(text, line, column, unknown[1] if unknown else None)
    return ConfigError(path, field, f"{detail} (line {line}, column {column})")


_TOKEN = re.compile(r"""\s+|\#[^\n]*|"(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?|[A-Za-z_][A-Za-z0-9_]*|[-+.0-9][A-Za-z0-9_.+-]*|.""")


def field_at(text: str, line: int, column: int, unknown: str | None = None) -> str:
    """The dotted name (``input[1].data_type``, a map's entry by its key: ``parameters.k``) of
    the field being read at ``line``:``column`` (1-based), or of ``unknown`` inside the message
    open there."""
    lines = text.splitlines(keepends=True)
    end = sum(len(text_line) for text_line in lines[:line - 1]) + column - 1
    messages = [_Frame("")]  # the messages open, innermost last
    opened: list[str] = []  # "{" or "[:<field>", innermost last
    field = ""
    for token in _TOKEN.finditer(text, 0, end):
        word = token.group()
        if word[0].isalpha() or word[0] == "_":
            if _next_is_field_end(text, token.end()):
                field = word
        elif word[0] in "\"'" and field == "key" and len(word) > 1:
            messages[-1].key = word[1:-1]
        elif word == "[":
            opened.append(f"[:{field}")
        elif word == "]" and opened and opened[-1].startswith("["):
            opened.pop()
        elif word in ("{", "<"):
            owner = opened[-1][2:] if opened and opened[-1].startswith("[") else field
            messages.append(messages[-1].child(owner))
            opened.append("{")
            field = ""
        elif word in ("}", ">") and opened and opened[-1] == "{":
            opened.pop()
            messages.pop()
            field = opened[-1][2:] if opened and opened[-1].startswith("[") else ""
    name = unknown if unknown is not None else field
    return _single_indices(messages[-1].dotted(name) if name else (messages[-1].name or "(config)"))


class _Frame:
    """A message open in the text: its dotted name, how often each field opened in it, and,
    for a map's entry, its key once read."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: dict[str, int] = {}
        self.key: str | None = None

    def child(self, field: str) -> _Frame:
        if field == "value" and self.key is not None:
            return _Frame(self.dotted(field))
        index = self.seen.get(field, 0)
        self.seen[field] = index + 1
        return _Frame(f"{self.name}.{field}[{index}]".lstrip("."))

    def dotted(self, field: str) -> str:
        if field == "value" and self.key is not None:  # an entry's value is named by its key
            return f"{_INDEX.sub('', self.name)}.{self.key}"
        return f"{self.name}.{field}".lstrip(".")


def _next_is_field_end(text: str, at: int) -> bool:
    """Whether the identifier ending at ``at`` is a field name (``:``, ``{`` or ``<`` follows)."""
    rest = text[at:at + 64].lstrip()
    return rest[:1] in (":", "{", "<", "[")


def _single_indices(dotted: str) -> str:
    """``[0]`` dropped after a field written once and not repeated in the schema (``dynamic_batching``)."""
    parts = []
    descriptor = model_config_pb2.ModelConfig.DESCRIPTOR
    for part in dotted.split("."):
        base = part.split("[")[0]
        field = descriptor.fields_by_name.get(base) if descriptor is not None else None
        if field is not None and not field.is_repeated:
            part = base
        parts.append(part)
        descriptor = field.message_type if field is not None else None
    return ".".join(parts)


def _json_field(message: str) -> str:
    named = re.search(r'has no field named "([^"]+)"|Failed to parse (\w+) field', message)
    if named is None:
        return "(config)"
    return named[1] or named[2]
