"""The worker itself: which models it serves, and starting and stopping the rest.

Each model may hold at most ``prefetch`` rounds of its instances' capacity in
flight, so on a shared broker the queue stays on the broker for idle workers
instead of piling up on a busy one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

import structlog

from broker import channels
from broker.claims.check import Claims, NoClaims
from broker.envelope import Request, Response
from broker.transport import Transport
from workers.backends.triton_python import bls
from workers.backends.triton_python.bls import BrokerModelCaller
from workers.cache.cached import AnswerCache
from workers.deadletter import DeadLetters
from workers.ensemble.broker_caller import BrokerStepCaller
from workers.ensemble.runner import EnsembleRunner
from workers.formats.envelope import EnvelopeFormat, MessageFormat
from workers.model_loader import ModelLoader, RunnerFactory
from workers.rate_limit import RateLimiter
from workers.model_set import ModelSet, Served
from workers.repository.config import ModelConfig
from workers.repository.layout import ModelEntry, ModelRepository, RepositoryIndex
from workers.repository.overrides import LoadOverrides
from workers.runner import ModelRunner
from workers.responder import Clocks, Runner
from workers.sequences.sessions import LocalSessions, SessionRouting
from workers.telemetry import NO_OBSERVER, Observer
from workers.worker.consumer import Channels, Consumer
from workers.worker.credit import InFlight
from workers.worker.delivery import DeliveryHandler, JobGate, JobStarts
from workers.worker.replies import Replier
from workers.worker.settings import WorkerSettings
from workers.worker.upkeep import Upkeep

log = structlog.get_logger("ferry.worker")


class Worker:
    def __init__(
        self,
        transport: Transport,
        repository: ModelRepository,
        settings: WorkerSettings = WorkerSettings(),
        runner_factory: RunnerFactory | None = None,
        job_gate: JobGate | None = None,
        message_format: MessageFormat = EnvelopeFormat(),
        sessions: SessionRouting | None = None,
        observer: Observer = NO_OBSERVER,
        wall_ns: Callable[[], int] = time.time_ns,
        claims: Claims = NoClaims(),
        cache: AnswerCache | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        self._repository = repository
        self._settings = settings
        self._caches = cache is not None
        self._limiter = limiter
        self._sessions = sessions or LocalSessions()
        self._observer = observer
        self._wall_ns = wall_ns
        self._models = ModelSet()
        self._loader = ModelLoader(repository, runner_factory or self._new_runner)
        self._model_locks: dict[str, asyncio.Lock] = {}
        self._unloading: set[str] = set()
        self._stopping = asyncio.Event()
        prefix = settings.channel_prefix
        dead_letters = DeadLetters(transport, prefix, message_format, settings.dead_letters, observer)
        self._handler = handler = DeliveryHandler(
            self._models, Replier(transport, message_format, dead_letters, settings.recovery, claims),
            message_format, self._sessions, JobStarts(job_gate, channels.job_reply_channel(prefix)), observer,
            settings.worker_id, wall_ns, claims, cache)
        self._in_flight = InFlight(handler.handle, settings.recovery.idle_s)
        channels_of = Channels(self._models, self._sessions, prefix)
        self._consumer = Consumer(transport, settings, channels_of, self._in_flight, self._active)
        self._upkeep = Upkeep(transport, settings, self._models, channels_of, self._sessions, self._in_flight,
                              self._active)
        # Ensembles' steps go to their models over the broker; replies come back here.
        self._steps = BrokerStepCaller(transport, settings.worker_id, prefix, claims=claims)

    @property
    def worker_id(self) -> str:
        return self._settings.worker_id

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self, index: RepositoryIndex | None = None) -> None:
        """Load the models the control mode starts with; ``index`` spares a
        second scan when the caller has one."""
        # Python models' own requests (BLS) go out through this worker's step caller.
        bls.install(BrokerModelCaller(self._steps, self._step_config, asyncio.get_running_loop(),
                                      self._settings.channel_prefix))
        index = index or self._repository.scan()
        served = self._settings.models or tuple(sorted(index.entries))
        for name in self._settings.control.startup_models(served):
            if name not in index.entries:
                log.error("worker.model_unavailable", model=name, worker_id=self.worker_id,
                          reason=str(index.errors.get(name, "not in the repository")))
                continue
            try:
                await self.load_model(name)
            except Exception as exc:
                log.error("worker.load_failed", model=name, worker_id=self.worker_id, error=str(exc))

    def ready_models(self) -> Mapping[str, tuple[int, ...]]:
        return self._models.ready()

    def serves(self, model: str) -> bool:
        """Whether this worker may serve ``model`` (``WorkerSettings.models``)."""
        return not self._settings.models or model in self._settings.models

    def takes_directly(self, model: str) -> bool:
        """Whether a request for ``model`` made in this process may go straight to ``answer``:
        the model is served here and now, is neither a sequence model nor decoupled, and has
        no failure retried (a retry is the broker's redelivery)."""
        models = self._models
        if models.get(model) is None or not self._active(model) or models.stateful(model) or models.decoupled(model):
            return False
        return not (self._settings.recovery.retry_failures and models.retries_failures(model))

    async def answer(self, request: Request) -> Response:
        """Compute ``request`` here, without the broker (see ``takes_directly``); a failure is
        answered as an error response, as it would be on the broker."""
        return await self._handler.answer(request)

    async def load_model(self, model: str, overrides: LoadOverrides = LoadOverrides()) -> tuple[int, ...]:
        """Load or reload ``model``; return once its versions are ready, after
        the versions it replaced have answered what they were computing."""
        async with self._model_locks.setdefault(model, asyncio.Lock()):
            served = await self._loader.build(model, overrides, self._models.get(model))
            retired = self._models.install(model, served)
            self._serve(model, served)
            await self._models.retire(retired)
        return tuple(sorted(served.runners))

    async def unload_model(self, model: str) -> bool:
        """Stop consuming ``model``, answer what was taken, then unload it. False if it was not loaded."""
        async with self._model_locks.setdefault(model, asyncio.Lock()):
            if self._models.get(model) is None:
                return False
            self._unloading.add(model)
            credit = self._in_flight.wake(model)
            try:
                await self._consumer.stop(model)
                await credit.wait_until_idle()
                await self._models.retire(self._models.remove(model))
            finally:
                self._unloading.discard(model)
                self._in_flight.forget(model)
            return True

    def _serve(self, model: str, served: Served) -> None:
        """Size the model's credit to its runners and make sure it is consumed."""
        capacity = max(runner.capacity for runner in served.runners.values())
        limit = max(1, min(self._settings.max_in_flight, capacity * max(1, self._settings.prefetch)))
        credit = self._in_flight.size(model, limit, self._settings.max_in_flight)
        if served.entry.config.response_cache.enable and not self._caches:
            log.warning("cache.not_configured", model=model,
                        detail="response_cache is on in its config, but no --cache-config was given: nothing is cached")
        if not self._stopping.is_set():
            self._consumer.start(model, credit)
            self._upkeep.start()

    def _active(self, model: str) -> bool:
        return not self._stopping.is_set() and model not in self._unloading

    async def drain(self) -> None:
        """Stop fetching; return once every delivery taken so far is answered and acked."""
        self._stopping.set()
        self._in_flight.wake_all()
        await self._upkeep.aclose()
        await self._consumer.join()
        await self._in_flight.join()

    async def aclose(self) -> None:
        self._stopping.set()
        await self._upkeep.aclose()
        await self._consumer.cancel()
        # An ensemble's steps may wait on models no longer consumed: end those waits.
        await self._steps.aclose()
        await self._in_flight.join()
        await self._models.aclose()

    def _new_runner(self, entry: ModelEntry, version: int) -> Runner:
        if entry.config.ensemble_scheduling is not None:
            return EnsembleRunner(entry, version, self._steps, self._step_config,
                                  self._settings.channel_prefix, Clocks(wall_ns=self._wall_ns))
        return ModelRunner(entry, version, state_store=self._sessions.state_store, observer=self._observer,
                           limiter=self._limiter)

    def _step_config(self, name: str) -> ModelConfig:
        """A step model's config: as loaded here (overrides included), else as the repository has it."""
        served = self._models.get(name)
        return served.entry.config if served is not None else self._repository.entry(name).config
