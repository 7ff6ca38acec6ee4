"""Model control: Triton's modes, and the messages that load and unload models
across a fleet.

- ``none``: every model is loaded at start; load and unload are refused.
- ``poll``: as ``none``, and the repository is scanned every ``poll_s``;
  models whose files changed are reloaded, new ones loaded, removed ones
  unloaded. Load and unload requests are refused, as Triton does.
- ``explicit``: only ``load_models`` (``*`` = all) at start; then load and
  unload requests.

A gateway publishes a ``ControlMessage`` on ``ferry.control``. Every worker
reads that channel in a group of its own (a broadcast), ignores what was sent
before it started, and answers each message with a ``ControlReply`` on the
channel the message names. Both are msgpack maps with no extension types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgpack

from workers.repository.overrides import LoadOverrides, from_wire

Mode = Literal["none", "poll", "explicit"]
MODES: tuple[Mode, ...] = ("none", "poll", "explicit")
ALL_MODELS = "*"
MAX_MESSAGE_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class ControlSettings:
    mode: Mode = "none"
    poll_s: float = 15.0
    load_models: tuple[str, ...] = ()  # explicit mode: loaded at start ('*' = all)

    @property
    def accepts_requests(self) -> bool:
        return self.mode == "explicit"

    @property
    def expected_models(self) -> tuple[str, ...] | None:
        """What must be ready for the server to be ready; None: every model."""
        if self.mode != "explicit" or ALL_MODELS in self.load_models:
            return None
        return self.load_models

    def startup_models(self, available: tuple[str, ...]) -> tuple[str, ...]:
        if self.mode != "explicit" or ALL_MODELS in self.load_models:
            return available
        return tuple(name for name in self.load_models)


Action = Literal["load", "unload"]
Outcome = Literal["loaded", "unloaded", "skipped", "failed"]


@dataclass(frozen=True, slots=True)
class ControlMessage:
    id: str
    action: Action
    model: str
    reply_to: str
    sent_ns: int
    overrides: LoadOverrides = field(default_factory=LoadOverrides)


@dataclass(frozen=True, slots=True)
class ControlReply:
    id: str
    worker: str
    model: str
    outcome: Outcome
    versions: tuple[int, ...] = ()
    error: str = ""
    code: str = ""


class ControlDecodeError(ValueError):
    pass


def encode_message(message: ControlMessage) -> bytes:
    return _pack({"v": 1, "kind": "control", "id": message.id, "action": message.action,
                  "model": message.model, "reply_to": message.reply_to, "sent_ns": message.sent_ns,
                  "overrides": message.overrides.to_wire()})


def decode_message(raw: bytes) -> ControlMessage:
    """``ControlDecodeError`` for bytes that are not a control message;
    ``InvalidOverride`` for overrides that fail their checks."""
    body = _unpack(raw, "control")
    action, model = body.get("action"), body.get("model")
    if action not in ("load", "unload") or not isinstance(model, str):
        raise ControlDecodeError("a control message needs an action (load or unload) and a model")
    return ControlMessage(_text(body, "id"), action, model, _text(body, "reply_to"), _int(body, "sent_ns"),
                          from_wire(model, body.get("overrides")))


def encode_reply(reply: ControlReply) -> bytes:
    return _pack({"v": 1, "kind": "control_reply", "id": reply.id, "worker": reply.worker,
                  "model": reply.model, "outcome": reply.outcome, "versions": list(reply.versions),
                  "error": reply.error, "code": reply.code})


def decode_reply(raw: bytes) -> ControlReply:
    body = _unpack(raw, "control_reply")
    outcome = body.get("outcome")
    versions = body.get("versions")
    if outcome not in ("loaded", "unloaded", "skipped", "failed") or not isinstance(versions, list):
        raise ControlDecodeError("a control reply needs an outcome and a list of versions")
    return ControlReply(_text(body, "id"), _text(body, "worker"), _text(body, "model"), outcome,
                        tuple(v for v in versions if isinstance(v, int) and not isinstance(v, bool)),
                        _text(body, "error"), _text(body, "code"))


def _pack(body: dict[str, Any]) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def _unpack(raw: bytes, kind: str) -> dict[str, Any]:
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_ext_len=0,
                               max_bin_len=MAX_MESSAGE_BYTES)
    except Exception as exc:  # msgpack raises many types for corrupt input
        raise ControlDecodeError(f"not msgpack: {exc}") from None
    if not isinstance(body, dict) or body.get("v") != 1 or body.get("kind") != kind:
        raise ControlDecodeError(f"not a {kind} message")
    return body


def _text(body: dict[str, Any], key: str) -> str:
    value = body.get(key, "")
    if not isinstance(value, str):
        raise ControlDecodeError(f"field '{key}' must be a string")
    return value


def _int(body: dict[str, Any], key: str) -> int:
    value = body.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ControlDecodeError(f"field '{key}' must be an integer")
    return value
