"""The worker: consume a model's request channel, infer, reply, then ack.

A message is acked only after its reply is published, so a worker that dies
mid-batch leaves the message pending for another to claim; either way the
loop keeps consuming.

``answer()`` computes a request handed over within the process (``ferry serve`` on its
embedded broker), as a delivery's request is computed, for a model ``takes_directly``
allows.

``drain()`` stops fetching and waits for what is in flight to be answered and
acked, for a clean shutdown. ``load_model`` and ``unload_model`` change what
is served while the worker runs (``workers.model_loader`` builds the runners,
``workers.model_set`` hands them over and drains the old ones); the control
mode in ``WorkerSettings.control`` says which models load at start.

Its rooms, after dramatiq's Worker, consumer and worker threads:

    lifecycle  ``Worker``: models loaded and unloaded, start, drain, close
    credit     ``InFlight``: handler tasks, each holding a unit of its model's ``Credit``
    consumer   ``Consumer``: fetching each model's channels while its credit has room
    upkeep     ``Upkeep``: reclaiming, trimming, adopting dead workers' sessions
    delivery   ``DeliveryHandler``: one delivery, from bytes to reply (job gate, sessions, streams)
    replies    ``Replier``: publishing, acking, forwarding, releasing, dead-lettering
    settings   ``WorkerSettings``
"""

from workers.model_loader import RunnerFactory
from workers.responder import FINAL_FLAG
from workers.worker.delivery import JobGate
from workers.worker.lifecycle import Worker
from workers.worker.settings import WorkerSettings

__all__ = ["FINAL_FLAG", "JobGate", "RunnerFactory", "Worker", "WorkerSettings"]
