"""The wire envelope: what travels on request and reply channels.

A request or a response is a frozen dataclass, encoded with msgpack as a map
of plain values (no ext types, never pickle). ``decode_*`` checks every field's
type and bounds and raises ``EnvelopeError`` for anything else, so a malformed
message costs the caller one exception and nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgpack

from broker.errors import EnvelopeError
from broker.quick_init import quick_init

WIRE_VERSION = 1


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on one envelope. The gateway checks a request against the same
    object before it publishes (``gateway.v2_codec``, ``gateway.service``), so
    what it accepts, a worker can decode."""

    max_message_bytes: int = 256 * 1024 * 1024
    max_tensors: int = 256  # inputs, outputs, and requested output names
    max_dims: int = 16
    max_dim_size: int = 2**40 - 1
    max_params: int = 64
    max_name_len: int = 256
    max_timeout_us: int = 30 * 24 * 3600 * 1_000_000  # 30 days; keeps deadline_ns inside an int64


DEFAULT_LIMITS = Limits()

ParamValue = str | int | float | bool
SequenceId = int | str

_T = TypeVar("_T")


@quick_init
@dataclass(frozen=True, slots=True)
class WireTensor:
    """A tensor as raw little-endian bytes (BYTES: length-prefixed elements).

    A claim-checked tensor travels without its bytes: ``claim`` names where
    they wait (``broker.claims``) and ``data`` is empty until they are redeemed.
    A redeemed tensor keeps its claim beside its bytes, and is sent on inline.

    ``data`` may be a view (a ``memoryview``) on the bytes the tensor arrived in, or on
    the array a model returned: what is read from an HTTP body or written to a response
    is not copied on the way. A decoded envelope's are ``bytes``."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes | memoryview
    claim: str = ""


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    code: str
    message: str


@quick_init
@dataclass(frozen=True, slots=True)
class Request:
    id: str
    model: str
    inputs: tuple[WireTensor, ...]
    reply_to: str
    model_version: str = ""
    outputs: tuple[str, ...] = ()
    priority: int = 0
    timeout_us: int = 0
    deadline_ns: int = 0
    sequence_id: SequenceId | None = None
    sequence_start: bool = False
    sequence_end: bool = False
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    trace: dict[str, str] = field(default_factory=dict)
    created_ns: int = 0
    # Non-empty: the sender takes claim-checked outputs of its reply itself, and this names it
    # (its ``broker.claims.store.process_tag``), so that blobs left for it go once it is gone.
    claim_owner: str = ""


@quick_init
@dataclass(frozen=True, slots=True)
class Response:
    id: str
    model: str
    model_version: str = ""
    outputs: tuple[WireTensor, ...] = ()
    error: ErrorInfo | None = None
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    final: bool = True

    def with_id(self, id: str) -> Response:
        """This response under another request id (``dataclasses.replace`` costs several times more)."""
        return Response(id, self.model, self.model_version, self.outputs, self.error, self.parameters, self.final)


def encode_request(request: Request) -> bytes:
    return _pack({
        "v": WIRE_VERSION,
        "kind": "request",
        "id": request.id,
        "model": request.model,
        "model_version": request.model_version,
        "reply_to": request.reply_to,
        "inputs": [_tensor_to_list(t) for t in request.inputs],
        "outputs": list(request.outputs),
        "priority": request.priority,
        "timeout_us": request.timeout_us,
        "deadline_ns": request.deadline_ns,
        "sequence_id": request.sequence_id,
        "sequence_start": request.sequence_start,
        "sequence_end": request.sequence_end,
        "parameters": request.parameters,
        "trace": request.trace,
        "created_ns": request.created_ns,
        "claim_owner": request.claim_owner,
    })


def encode_response(response: Response) -> bytes:
    error = None if response.error is None else [response.error.code, response.error.message]
    return _pack({
        "v": WIRE_VERSION,
        "kind": "response",
        "id": response.id,
        "model": response.model,
        "model_version": response.model_version,
        "outputs": [_tensor_to_list(t) for t in response.outputs],
        "error": error,
        "parameters": response.parameters,
        "final": response.final,
    })


def decode_request(raw: bytes, limits: Limits = DEFAULT_LIMITS) -> Request:
    body = _Fields(_unpack(raw, limits), limits, "request")
    if not body.string("reply_to", limit=limits.max_name_len):
        raise EnvelopeError("request field 'reply_to' must name a reply channel")
    return Request(
        id=body.name("id"),
        model=body.name("model"),
        model_version=body.string("model_version", limit=limits.max_name_len),
        reply_to=body.string("reply_to", limit=limits.max_name_len),
        inputs=body.tensors("inputs"),
        outputs=tuple(body.names("outputs")),
        priority=body.integer("priority"),
        timeout_us=body.bounded("timeout_us", limits.max_timeout_us),
        deadline_ns=body.integer("deadline_ns"),
        sequence_id=body.sequence_id("sequence_id"),
        sequence_start=body.boolean("sequence_start"),
        sequence_end=body.boolean("sequence_end"),
        parameters=body.parameters("parameters"),
        trace=body.string_map("trace"),
        created_ns=body.integer("created_ns"),
        claim_owner=body.string("claim_owner", limit=limits.max_name_len),
    )


def decode_response(raw: bytes, limits: Limits = DEFAULT_LIMITS) -> Response:
    body = _Fields(_unpack(raw, limits), limits, "response")
    return Response(
        id=body.name("id"),
        model=body.string("model", limit=limits.max_name_len),
        model_version=body.string("model_version", limit=limits.max_name_len),
        outputs=body.tensors("outputs"),
        error=body.error("error"),
        parameters=body.parameters("parameters"),
        final=body.boolean("final", default=True),
    )


def peek_reply_to(raw: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[str, str] | None:
    """Best effort (id, reply_to) from a request that failed to decode, so the
    sender can still be told; None when even that much cannot be read.

    Only the top-level keys and those two values are built; every other value
    is skipped unbuilt, so a request over the count limits (too many
    parameters, say) is still answered, at no more cost than a scan."""
    if not isinstance(raw, (bytes, bytearray, memoryview)) or len(raw) > limits.max_message_bytes:
        return None
    try:
        found = _top_level_strings(raw, ("id", "reply_to"), limits.max_name_len)
    except Exception:  # msgpack raises many types for corrupt input
        return None
    request_id, reply_to = found.get("id"), found.get("reply_to")
    if request_id and reply_to:
        return request_id, reply_to
    return None


def _top_level_strings(raw: bytes, keys: tuple[str, ...], max_len: int) -> dict[str, str]:
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, ext_hook=_reject_ext, max_buffer_size=len(raw),
                                max_str_len=len(raw), max_bin_len=0, max_array_len=0, max_map_len=0,
                                max_ext_len=0)
    unpacker.feed(raw)
    found: dict[str, str] = {}
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        if key not in keys:
            unpacker.skip()
            continue
        value = unpacker.unpack()
        if isinstance(value, str):
            found[key] = value[:max_len]
        if len(found) == len(keys):
            break
    return found


def _tensor_to_list(tensor: WireTensor) -> list[Any]:
    if tensor.claim and not tensor.data:
        return [tensor.name, tensor.datatype, list(tensor.shape), b"", tensor.claim]
    return [tensor.name, tensor.datatype, list(tensor.shape), tensor.data]


def _pack(body: dict[str, Any]) -> bytes:
    return msgpack.packb(body, use_bin_type=True, datetime=False)


def _reject_ext(code: int, data: bytes) -> Any:
    raise EnvelopeError(f"msgpack ext type {code} is not allowed")


def _unpack(raw: bytes, limits: Limits) -> dict[str, Any]:
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise EnvelopeError(f"envelope must be bytes, not {type(raw).__name__}")
    if len(raw) > limits.max_message_bytes:
        raise EnvelopeError(
            f"envelope of {len(raw)} bytes exceeds the {limits.max_message_bytes}-byte limit"
        )
    try:
        body = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_reject_ext,
            max_str_len=limits.max_message_bytes,
            max_bin_len=limits.max_message_bytes,
            max_array_len=max(limits.max_tensors, limits.max_dims, 1024),
            max_map_len=max(limits.max_params, 32),
            max_ext_len=64,  # small enough to be cheap; ext_hook refuses them all
        )
    except EnvelopeError:
        raise
    except Exception as exc:  # msgpack raises many types for corrupt input
        raise EnvelopeError(f"not a msgpack envelope: {exc}") from None
    if not isinstance(body, dict):
        raise EnvelopeError(f"envelope must be a map, got {type(body).__name__}")
    if body.get("v") != WIRE_VERSION:
        raise EnvelopeError(f"unsupported envelope version {body.get('v')!r}")
    return body


class _Fields:
    """Typed, bounded access to the fields of one decoded map."""

    def __init__(self, body: dict[str, Any], limits: Limits, kind: str) -> None:
        if body.get("kind") != kind:
            raise EnvelopeError(f"expected a {kind} envelope, got kind {body.get('kind')!r}")
        self._body = body
        self._limits = limits

    def _get(self, key: str, types: type[_T] | tuple[type[_T], ...], default: _T) -> _T:
        value = self._body.get(key, default)
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            raise EnvelopeError(f"field '{key}' must not be a boolean")
        if not isinstance(value, types):
            raise EnvelopeError(f"field '{key}' has type {type(value).__name__}")
        return value

    def string(self, key: str, limit: int, default: str = "") -> str:
        value = self._get(key, str, default)
        if len(value) > limit:
            raise EnvelopeError(f"field '{key}' is longer than {limit} characters")
        return value

    def name(self, key: str) -> str:
        value = self.string(key, self._limits.max_name_len)
        if not value:
            raise EnvelopeError(f"field '{key}' is required")
        return value

    def names(self, key: str) -> list[str]:
        values = self._get(key, list, [])
        if len(values) > self._limits.max_tensors:
            raise EnvelopeError(f"field '{key}' lists more than {self._limits.max_tensors} names")
        if not all(isinstance(v, str) and 0 < len(v) <= self._limits.max_name_len for v in values):
            raise EnvelopeError(f"field '{key}' must be a list of names")
        return values

    def integer(self, key: str, default: int = 0) -> int:
        value = self._get(key, int, default)
        if not -(2**63) <= value < 2**64:
            raise EnvelopeError(f"field '{key}' is out of range")
        return value

    def bounded(self, key: str, maximum: int) -> int:
        value = self._get(key, int, 0)
        if not 0 <= value <= maximum:
            raise EnvelopeError(f"field '{key}' must be between 0 and {maximum}")
        return value

    def boolean(self, key: str, default: bool = False) -> bool:
        return self._get(key, bool, default)

    def sequence_id(self, key: str) -> SequenceId | None:
        value = self._get(key, (int, str, type(None)), None)
        if isinstance(value, str) and len(value) > self._limits.max_name_len:
            raise EnvelopeError(f"field '{key}' is too long")
        return value

    def parameters(self, key: str) -> dict[str, ParamValue]:
        values = self._get(key, dict, {})
        if len(values) > self._limits.max_params:
            raise EnvelopeError(f"field '{key}' has more than {self._limits.max_params} entries")
        for name, value in values.items():
            if not isinstance(value, (str, int, float, bool)):
                raise EnvelopeError(f"parameter '{name}' has type {type(value).__name__}")
        return values

    def string_map(self, key: str) -> dict[str, str]:
        values = self._get(key, dict, {})
        if not all(isinstance(v, str) for v in values.values()):
            raise EnvelopeError(f"field '{key}' must map strings to strings")
        return values

    def error(self, key: str) -> ErrorInfo | None:
        value = self._get(key, (list, type(None)), None)
        if value is None:
            return None
        if len(value) != 2 or not all(isinstance(v, str) for v in value):
            raise EnvelopeError(f"field '{key}' must be [code, message]")
        return ErrorInfo(code=value[0], message=value[1])

    def tensors(self, key: str) -> tuple[WireTensor, ...]:
        values = self._get(key, list, [])
        if len(values) > self._limits.max_tensors:
            raise EnvelopeError(f"field '{key}' has more than {self._limits.max_tensors} tensors")
        return tuple(self._tensor(key, index, value) for index, value in enumerate(values))

    def _tensor(self, key: str, index: int, value: Any) -> WireTensor:
        where = f"{key}[{index}]"
        if not isinstance(value, list) or len(value) not in (4, 5):
            raise EnvelopeError(f"{where} must be [name, datatype, shape, data] or [..., b'', claim]")
        name, datatype, shape, data = value[:4]
        claim = value[4] if len(value) == 5 else ""
        if not isinstance(name, str) or not 0 < len(name) <= self._limits.max_name_len:
            raise EnvelopeError(f"{where}: tensor name must be a non-empty string")
        if not isinstance(datatype, str) or len(datatype) > 16:
            raise EnvelopeError(f"{where} '{name}': datatype must be a short string")
        if not isinstance(shape, list) or len(shape) > self._limits.max_dims:
            raise EnvelopeError(f"{where} '{name}': shape must be a list of at most "
                                f"{self._limits.max_dims} dims")
        if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= self._limits.max_dim_size
                   for d in shape):
            raise EnvelopeError(f"{where} '{name}': shape dims must be non-negative integers "
                                f"of at most {self._limits.max_dim_size}")
        if not isinstance(data, bytes):
            raise EnvelopeError(f"{where} '{name}': data must be bytes")
        if len(value) == 5 and (not isinstance(claim, str) or not 0 < len(claim) <= self._limits.max_name_len
                                or data):
            raise EnvelopeError(f"{where} '{name}': a claim must be a non-empty string of at most "
                                f"{self._limits.max_name_len} characters, with empty data")
        return WireTensor(name=name, datatype=datatype, shape=tuple(shape), data=data, claim=claim)
