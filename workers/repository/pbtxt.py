"""Protocol Buffers text format, as Triton's ``config.pbtxt`` uses it.

``parse`` turns the text into plain values: a message is a ``dict``, a scalar
is an ``int``, ``float``, ``bool`` or ``str`` (enum identifiers such as
``TYPE_FP32`` stay strings), and a repeated field is a ``list``.

Text format alone cannot tell a repeated field written once from a singular
one, so the caller names the repeated fields (``TRITON_REPEATED`` by default);
those are always lists. Any other field written more than once, or written
with list syntax, becomes a list too, which lets validation name it precisely.
Map fields stay as protobuf writes them: a list of ``{"key": ..., "value":
...}`` entries.

Only ``ConfigError`` escapes, naming the file, the line:column and what was
expected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from workers.errors import ConfigError

# Repeated fields of Triton's ModelConfig, by field name; no singular field
# anywhere in that schema shares a name with one of these.
TRITON_REPEATED = frozenset({
    "input", "output", "dims", "shape", "instance_group", "gpus",
    "secondary_devices", "profile", "preferred_batch_size", "parameters",
    "versions", "model_warmup", "inputs", "batch_input", "batch_output",
    "source_input", "target_name", "control_input", "control", "state",
    "initial_state", "int32_false_true", "fp32_false_true", "bool_false_true",
    "step", "input_map", "output_map", "gpu_execution_accelerator",
    "cpu_execution_accelerator", "graph_spec", "dim", "agents",
    "op_library_filename", "priority_queue_policy", "resources", "global",
})

MAX_DEPTH = 64

_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n\f\v]+|\#[^\n]*)
  | (?P<float>-(?:inf(?:inity)?|nan)\b)
  | (?P<number>-?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[fF]?)
        (?![A-Za-z0-9_.]))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<punct>[{}\[\]<>:,;])
""", re.VERBOSE | re.IGNORECASE)

_SIMPLE_ESCAPES = {
    "n": b"\n", "t": b"\t", "r": b"\r", "a": b"\a", "b": b"\b", "f": b"\f",
    "v": b"\v", "\\": b"\\", "'": b"'", '"': b'"', "?": b"?",
}
_ESCAPE = re.compile(
    r"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))",
    re.DOTALL,
)
_CLOSE = {"{": "}", "<": ">"}
_IDENT_VALUES: dict[str, Any] = {
    "true": True, "false": False,
    "inf": float("inf"), "infinity": float("inf"), "nan": float("nan"),
}


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # float, number, ident, string, punct or eof
    text: str
    line: int
    column: int

    def describe(self) -> str:
        return "end of file" if self.kind == "eof" else repr(self.text)


def parse(text: str, path: str, repeated: frozenset[str] = TRITON_REPEATED) -> dict[str, Any]:
    """Parse pbtxt ``text``; ``path`` only names the file in errors."""
    parser = _Parser(_tokenize(text, path), path, repeated)
    return parser.message(closer=None, depth=0)


def parse_file(path: Path, repeated: frozenset[str] = TRITON_REPEATED) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(str(path), "(file)", f"not valid UTF-8 at byte {err.start}") from None
    except OSError as err:
        raise ConfigError(str(path), "(file)", f"cannot read: {err.strerror or err}") from None
    return parse(text, str(path), repeated)



def map_entries(value: Any, example: str, twice: str = "") -> Any:
    """Protobuf map entries as pbtxt gives them, ``[{key, value}]``, as
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

def _tokenize(text: str, path: str) -> list[Token]:
    tokens: list[Token] = []
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        column = pos - line_start + 1
        if match is None:
            problem = "unterminated string" if text[pos] in "\"'" else f"unexpected character {text[pos]!r}"
            raise ConfigError(path, "(syntax)", f"line {line}:{column}: {problem}")
        kind = match.lastgroup or ""
        if kind != "space":
            tokens.append(Token(kind, match.group(), line, column))
        newlines = match.group().count("\n")
        if newlines:
            line += newlines
            line_start = match.start() + match.group().rindex("\n") + 1
        pos = match.end()
    tokens.append(Token("eof", "", line, pos - line_start + 1))
    return tokens


class _Unclosed(Exception):
    """End of file inside a message; the opener reports it with its position."""


class _Parser:
    def __init__(self, tokens: list[Token], path: str, repeated: frozenset[str]) -> None:
        self._tokens = tokens
        self._index = 0
        self._path = path
        self._repeated = repeated
        self._fields: list[str] = []  # the enclosing field names, for errors

    def message(self, closer: str | None, depth: int) -> dict[str, Any]:
        if depth > MAX_DEPTH:
            self._fail(f"messages nested deeper than {MAX_DEPTH} levels")
        fields: dict[str, list[Any]] = {}
        listed: set[str] = set()
        while not self._at_end(closer):
            name = self._expect_kind("ident", "a field name").text
            self._fields.append(name)
            values, is_list = self._field_value(name, depth)
            self._fields.pop()
            fields.setdefault(name, []).extend(values)
            if is_list:
                listed.add(name)
            self._skip_separator()
        if closer is not None:
            self._advance()
        return {name: self._shape(name, values, name in listed) for name, values in fields.items()}

    def _shape(self, name: str, values: list[Any], is_list: bool) -> Any:
        if name in self._repeated or is_list or len(values) != 1:
            return values
        return values[0]

    def _field_value(self, name: str, depth: int) -> tuple[list[Any], bool]:
        colon = self._accept(":")
        token = self._peek()
        if token.text in _CLOSE:
            return [self._message_value(depth)], False
        if token.text == "[":
            return self._list(name, depth), True
        if not colon:
            self._fail(f"expected ':' or '{{' after field '{name}', found {token.describe()}")
        return [self._scalar(name)], False

    def _message_value(self, depth: int) -> dict[str, Any]:
        opener = self._advance()
        try:
            return self.message(closer=_CLOSE[opener.text], depth=depth + 1)
        except _Unclosed:
            self._fail(
                f"expected '{_CLOSE[opener.text]}' to close the '{opener.text}' "
                f"opened at line {opener.line}:{opener.column}, found end of file"
            )

    def _list(self, name: str, depth: int) -> list[Any]:
        self._advance()
        values: list[Any] = []
        if self._accept("]"):
            return values
        while True:
            if self._peek().text in _CLOSE:
                values.append(self._message_value(depth))
            else:
                values.append(self._scalar(name))
            if self._accept("]"):
                return values
            if not self._accept(","):
                self._fail(f"expected ',' or ']' in the list for '{name}', found {self._peek().describe()}")

    def _scalar(self, name: str) -> Any:
        token = self._peek()
        if token.kind == "string":
            return self._strings()
        if token.kind in ("number", "float", "ident"):
            try:
                value = _scalar_value(token)
            except ValueError:  # Python refuses to convert ints of thousands of digits
                self._fail(f"number {token.text[:20]}... is too long")
            self._advance()
            return value
        self._fail(f"expected a value for '{name}', found {token.describe()}")

    def _strings(self) -> str:
        # Adjacent string literals concatenate, as in C and protobuf.
        raw = b""
        first = self._peek()
        while self._peek().kind == "string":
            raw += _unescape(self._advance().text[1:-1])
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self._error(first, "string is not valid UTF-8") from None

    def _skip_separator(self) -> None:
        if not self._accept(","):
            self._accept(";")

    def _at_end(self, closer: str | None) -> bool:
        token = self._peek()
        if closer is None:
            return token.kind == "eof"
        if token.kind == "eof":
            raise _Unclosed
        return token.text == closer

    def _expect_kind(self, kind: str, what: str) -> Token:
        token = self._peek()
        if token.kind != kind:
            self._fail(f"expected {what}, found {token.describe()}")
        return self._advance()

    def _accept(self, punct: str) -> bool:
        token = self._peek()
        if token.kind == "punct" and token.text == punct:
            self._advance()
            return True
        return False

    def _peek(self) -> Token:
        return self._tokens[self._index]

    def _advance(self) -> Token:
        token = self._tokens[self._index]
        self._index = min(self._index + 1, len(self._tokens) - 1)
        return token

    def _error(self, token: Token, message: str) -> ConfigError:
        field = ".".join(self._fields) or "(syntax)"
        return ConfigError(self._path, field, f"line {token.line}:{token.column}: {message}")

    def _fail(self, message: str) -> NoReturn:
        raise self._error(self._peek(), message)


def _scalar_value(token: Token) -> Any:
    text = token.text
    if token.kind == "float":
        return float(text.lower().replace("infinity", "inf"))
    if token.kind == "ident":
        return _IDENT_VALUES.get(text.lower(), text)
    if text.lower().lstrip("-").startswith("0x"):
        return int(text, 16)
    if any(c in text for c in ".eEfF"):
        return float(text.rstrip("fF"))
    return int(text)


def _unescape(body: str) -> bytes:
    out = bytearray()
    pos = 0
    for match in _ESCAPE.finditer(body):
        out += body[pos:match.start()].encode("utf-8", "surrogatepass")
        out += _escape_bytes(match)
        pos = match.end()
    out += body[pos:].encode("utf-8", "surrogatepass")
    return bytes(out)


def _escape_bytes(match: re.Match[str]) -> bytes:
    octal, hex_byte, short, long, simple = match.groups()
    if octal is not None:
        return bytes([int(octal, 8) & 0xFF])
    if hex_byte is not None:
        return bytes([int(hex_byte, 16)])
    if short is not None or long is not None:
        return chr(min(int(short or long, 16), 0x10FFFF)).encode("utf-8", "surrogatepass")
    return _SIMPLE_ESCAPES.get(simple, ("\\" + simple).encode("utf-8", "surrogatepass"))
