"""The worker's side of the cache: look the request up, run the model on a miss,
keep a successful answer. The timeline records which it was and how long the
cache took (Triton's ``cache_hit`` and ``cache_miss`` statistics: a hit's
lookup, a miss's lookup and insertion). A hit is the kept answer under the
request's own id, its outputs byte for byte those the model gave."""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from broker.envelope import Request, Response, decode_response, encode_response
from broker.errors import EnvelopeError
from workers.cache.key import cache_key
from workers.cache.store import ResponseCache
from workers.responder import Responder
from workers.telemetry.timeline import CACHE_HIT, CACHE_MISS, Timeline

log = structlog.get_logger("ferry.cache")
KEPT_ID = "cached"  # the id a kept answer is stored under; a hit takes the request's own


class AnswerCache:
    def __init__(self, store: ResponseCache, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.store = store
        self._clock = clock

    async def respond(self, runner: Responder, request: Request, timeline: Timeline) -> Response:
        key = cache_key(request, runner.entry.name, runner.version)
        started = self._clock()
        found = await self.store.get(key)
        if found is not None:
            try:
                kept = decode_response(found)
            except EnvelopeError as exc:  # written by another release, or damaged: computed afresh
                log.warning("cache.unreadable_entry", model=request.model, error=str(exc))
            else:
                timeline.cache, timeline.cache_ns = CACHE_HIT, self._clock() - started
                return kept.with_id(request.id)
        looked = self._clock() - started
        response = await runner.respond(request, timeline)
        if response.error is None:
            started = self._clock()
            await self.store.put(key, encode_response(response.with_id(KEPT_ID)))
            looked += self._clock() - started
        timeline.cache, timeline.cache_ns = CACHE_MISS, looked
        return response

    async def aclose(self) -> None:
        await self.store.aclose()
