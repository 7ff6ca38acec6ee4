"""What a worker observes about the requests it serves.

``Timeline`` records when one request reached each stage (enqueued at the
gateway, received by the worker, its batch formed, computed, answered).
The worker and the runner fill it in and hand it, with each batch's
``BatchRecord`` and each dead letter's ``DeadLetterRecord``, to an
``Observer``: ``StatsBook`` keeps the counts and
histograms behind ``/metrics``, the dashboard and the heartbeat, and the
tracer turns a sampled timeline into spans. Neither the batcher nor the
transports know any of this exists.
"""

from workers.telemetry.observer import NO_OBSERVER, Observer, Observers
from workers.telemetry.timeline import BatchRecord, DeadLetterRecord, Timeline

__all__ = ["NO_OBSERVER", "BatchRecord", "DeadLetterRecord", "Observer", "Observers", "Timeline"]
