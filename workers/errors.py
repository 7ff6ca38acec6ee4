"""Errors raised by the worker side of ferry.

    WorkerError
     ├── ConfigError        a config.pbtxt or repository layout is invalid
     ├── ModelNotFound      no such model or version in the repository
     ├── ModelLoadError     a backend could not load a model's files
     ├── InvalidInput       one request's tensors or parameters are wrong
     │    ├── TensorError   a tensor's datatype, shape or bytes are wrong
     │    └── SequenceError a step does not fit its sequence (no START, timed out...)
     ├── SessionLost        a sequence's state died with its worker, unrecoverably
     ├── RequestTimeout     a request's deadline passed before compute
     ├── ExecutionError     the backend failed while running a batch
     └── StepError          an ensemble's step failed (its code is the step's own)

Each error carries a ``code`` that travels on the wire as plain data with the
message; only the gateway turns codes into HTTP statuses.
"""

from __future__ import annotations


class WorkerError(Exception):
    code = "internal"


class ConfigError(WorkerError):
    """Names the file and the field at fault."""

    code = "invalid_config"

    def __init__(self, path: str, field: str, message: str) -> None:
        super().__init__(f"{path}: field '{field}': {message}")
        self.path = path
        self.field = field
        self.detail = message


class ModelNotFound(WorkerError):
    code = "not_found"


class ModelLoadError(WorkerError):
    code = "unavailable"


class InvalidInput(WorkerError):
    code = "invalid_argument"


class TensorError(InvalidInput):
    pass


class RequestTimeout(WorkerError):
    code = "timeout"


class ExecutionError(WorkerError):
    code = "internal"


class SequenceError(InvalidInput):
    """A step does not fit its sequence: no START, an unknown, ended or
    timed-out sequence, or a correlation id of the wrong type."""


class SessionLost(WorkerError):
    """The sequence existed, but the worker that held its state died and no
    checkpoint of it was kept. Never a silent reset."""

    code = "session_lost"


class StepError(WorkerError):
    """A step of an ensemble failed; it keeps the step's error code, so a bad
    input to a step is still ``invalid_argument``."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code
