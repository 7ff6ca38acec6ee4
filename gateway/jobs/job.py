"""A job: one inference request submitted with ``Prefer: respond-async``.

A job carries what any gateway needs to answer a poll: the model, the status,
the envelope ``Response`` (encoded with ``broker.envelope.encode_response``)
once it arrives, and how the original request asked for the body to be
rendered. ``encode_meta``/``decode_meta`` turn the unchanging part into
msgpack for stores that keep bytes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import msgpack

from gateway.v2_codec import RequestedOutput


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED})


@dataclass(frozen=True, slots=True)
class Rendering:
    """How the submitting request asked for its response body."""

    request_id: str = ""
    outputs: tuple[RequestedOutput, ...] = ()
    binary_default: bool = False


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    model: str
    model_version: str
    created_ns: int
    rendering: Rendering = Rendering()
    status: JobStatus = JobStatus.QUEUED
    result: bytes = b""  # an encoded envelope Response once finished


class JobCodecError(ValueError):
    pass


def encode_meta(job: Job) -> bytes:
    return msgpack.packb({
        "id": job.id,
        "model": job.model,
        "model_version": job.model_version,
        "created_ns": job.created_ns,
        "request_id": job.rendering.request_id,
        "outputs": [[o.name, o.binary, o.classification] for o in job.rendering.outputs],
        "binary_default": job.rendering.binary_default,
    }, use_bin_type=True)


def decode_meta(raw: bytes, status: JobStatus, result: bytes) -> Job:
    try:
        body: Any = msgpack.unpackb(raw, raw=False, ext_hook=_reject_ext)
        outputs = tuple(_requested(output) for output in body["outputs"])
        rendering = Rendering(str(body["request_id"]), outputs, bool(body["binary_default"]))
        return Job(str(body["id"]), str(body["model"]), str(body["model_version"]),
                   int(body["created_ns"]), rendering, status, result)
    except Exception as exc:  # msgpack and a malformed map raise many types
        raise JobCodecError(f"unreadable job record: {exc}") from None


def _requested(raw: Any) -> RequestedOutput:
    """``[name, binary]``, or ``[name, binary, classes]`` since classification (older records lack it)."""
    name, binary, *rest = raw
    return RequestedOutput(str(name), bool(binary), classification=int(rest[0]) if rest else 0)


def _reject_ext(code: int, data: bytes) -> Any:
    raise JobCodecError(f"msgpack ext type {code} is not allowed")
