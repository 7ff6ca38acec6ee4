"""When one request reached each stage of its trip through a worker.

All times are wall-clock nanoseconds (``time.time_ns``): the gateway stamps
``enqueued_ns`` in another process, and spans are exported in epoch time.
A stage not reached stays 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.envelope import Request
from broker.quick_init import quick_init

SUCCESS = "success"
RELEASED = "released"  # handed back to the broker for another worker: neither success nor failure here
CANCELLED = "cancelled"  # a job cancelled or expired before compute
REJECTED = "rejected"  # not a request this model can read (dead-lettered)
EXHAUSTED = "exhausted"  # delivered too many times (dead-lettered)
CACHE_HIT = "hit"  # answered from the response cache
CACHE_MISS = "miss"  # looked up, computed, kept


@dataclass(slots=True)
class Timeline:
    request_id: str
    model: str
    version: str
    worker_id: str
    trace: dict[str, str] = field(default_factory=dict)
    enqueued_ns: int = 0  # the gateway (or producer) published it
    received_ns: int = 0  # this worker took it from the broker
    compute_start_ns: int = 0
    compute_end_ns: int = 0
    done_ns: int = 0  # the reply was published
    batch_id: str = ""
    batch_size: int = 0  # rows in the batch it ran in
    rows: int = 1  # rows this request contributed
    input_ns: int = 0  # of its batch: merging the inputs, running the model, splitting the outputs
    infer_ns: int = 0
    output_ns: int = 0
    outcome: str = SUCCESS  # SUCCESS, or the error code that failed it
    cache: str = ""  # CACHE_HIT or CACHE_MISS for a model whose answers are cached
    cache_ns: int = 0  # a hit's lookup; a miss's lookup and insertion

    @classmethod
    def of(cls, request: Request, worker_id: str, received_ns: int) -> Timeline:
        return cls(request_id=request.id, model=request.model, version=request.model_version,
                   worker_id=worker_id, trace=dict(request.trace), enqueued_ns=request.created_ns,
                   received_ns=received_ns)

    @classmethod
    def unread(cls, model: str, worker_id: str, received_ns: int) -> Timeline:
        """For a delivery that never became a request."""
        return cls(request_id="", model=model, version="", worker_id=worker_id, received_ns=received_ns)

    @property
    def succeeded(self) -> bool:
        return self.outcome == SUCCESS

    def ran_in(self, batch: BatchRecord) -> None:
        self.batch_id = batch.batch_id
        self.batch_size = batch.size
        self.compute_start_ns = batch.start_ns
        self.compute_end_ns = batch.end_ns
        self.input_ns, self.infer_ns, self.output_ns = batch.input_ns, batch.infer_ns, batch.output_ns


@quick_init
@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One execution of a model instance on a merged batch."""

    model: str
    version: str
    batch_id: str
    size: int  # rows
    requests: int
    start_ns: int
    end_ns: int
    # Triton's compute_input, compute_infer and compute_output: the batch's inputs merged,
    # the model run, its outputs split (0 where the runner does not tell them apart).
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """One letter written to the dead-letter channel."""

    payload_bytes: int  # the original message's size
    kept_bytes: int  # how much of it the letter holds (less when cut to its share of the bound)
    evicted: int  # older letters the count bound dropped after it was written

    @property
    def truncated(self) -> bool:
        return self.kept_bytes < self.payload_bytes
