"""When a tensor is claim-checked, and how a message's claims are redeemed and released.

The sender stashes every tensor of at least ``threshold_bytes`` in the store
and sends the envelope with claims in their place. Who deletes the bytes:

- a request's inputs: the worker, after it has acked the request. Until then a
  redelivery (the worker died mid-request) still finds them;
- a reply's outputs: the gateway, as soon as it has read them. Only a request
  that names a ``claim_owner`` gets claim-checked outputs: a sender that waits
  for its reply. Job results are kept whole, since the job store holds them
  longer than any claim lives.

Whatever a crash leaves behind expires after ``ttl_s``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from broker.claims.store import ClaimStore
from broker.envelope import Request, Response, WireTensor
from broker.errors import ClaimMissing


# Where a store's default threshold comes from (benchmarks/bench_cpu.py, docs/claim-check.md):
# through /dev/shm a 301 KB tensor already costs less CPU beside the message than in it; through
# Redis, below Kafka's default max.message.bytes (1 MB) with room to spare.
DEFAULT_THRESHOLDS = {"shm": 64 * 1024, "redis": 512 * 1024}


@dataclass(frozen=True, slots=True)
class ClaimSettings:
    threshold_bytes: int | None = None  # None: the store's default (DEFAULT_THRESHOLDS); 0: never
    ttl_s: float = 900.0

    def __post_init__(self) -> None:
        if self.threshold_bytes is not None and self.threshold_bytes < 0:
            raise ValueError(f"the claim-check threshold must be 0 (off) or more bytes, got {self.threshold_bytes}")
        if self.ttl_s <= 0:
            raise ValueError(f"a claim's TTL must be positive, got {self.ttl_s:g} s")


class Claims(Protocol):
    """What senders and receivers of envelopes ask: ``ClaimCheck`` with a store, ``NoClaims`` without."""

    async def stash_request(self, request: Request, claim_outputs: bool) -> Request: ...

    async def stash_response(self, response: Response, request: Request | None) -> Response: ...

    async def redeem_request(self, request: Request) -> Request: ...

    async def redeem_response(self, response: Response) -> Response: ...

    async def release(self, request: Request) -> None: ...

    async def aclose(self) -> None: ...


class ClaimCheck:
    def __init__(self, store: ClaimStore, settings: ClaimSettings = ClaimSettings()) -> None:
        self._store = store
        self._ttl_s = settings.ttl_s
        threshold = settings.threshold_bytes
        if threshold is None:
            threshold = DEFAULT_THRESHOLDS.get(store.scheme, DEFAULT_THRESHOLDS["redis"])
        self.threshold_bytes = threshold

    async def stash_request(self, request: Request, claim_outputs: bool) -> Request:
        """``request`` with its large inputs in the store; with ``claim_outputs``,
        its reply may claim-check its outputs too."""
        owner = self._store.owner
        inputs = await self._stash(request.inputs, owner)
        if inputs is request.inputs and not claim_outputs:
            return request
        return replace(request, inputs=inputs, claim_owner=owner if claim_outputs else "")

    async def stash_response(self, response: Response, request: Request | None) -> Response:
        """``response`` with its large outputs in the store, where its sender asked for that."""
        if request is None or not request.claim_owner or not response.outputs:
            return response
        outputs = await self._stash(response.outputs, request.claim_owner)
        return response if outputs is response.outputs else replace(response, outputs=outputs)

    async def redeem_request(self, request: Request) -> Request:
        """``request`` with its claimed inputs' bytes back; raises ClaimMissing
        (naming the input) when they are gone. Each input keeps its claim, for
        ``release`` once the request is answered."""
        inputs = await self._redeem(request.inputs, "input", keep_claims=True)
        return request if inputs is request.inputs else replace(request, inputs=inputs)

    async def redeem_response(self, response: Response) -> Response:
        """``response`` with its claimed outputs' bytes back, and those bytes
        deleted from the store: nobody else reads a reply."""
        outputs = await self._redeem(response.outputs, "output", delete=True, keep_claims=False)
        return response if outputs is response.outputs else replace(response, outputs=outputs)

    async def release(self, request: Request) -> None:
        """Delete the bytes of ``request``'s claimed inputs: it is answered and acked."""
        await self._store.delete(claims_of(request.inputs))

    async def aclose(self) -> None:
        await self._store.aclose()

    async def _stash(self, tensors: tuple[WireTensor, ...], owner: str) -> tuple[WireTensor, ...]:
        threshold = self.threshold_bytes
        large = [i for i, t in enumerate(tensors) if threshold and len(t.data) >= threshold]
        if not large:
            return tensors
        claims = await self._store.put([tensors[i].data for i in large], self._ttl_s, owner)
        stashed = list(tensors)
        for i, claim in zip(large, claims):
            stashed[i] = replace(tensors[i], data=b"", claim=claim)
        return tuple(stashed)

    async def _redeem(self, tensors: tuple[WireTensor, ...], kind: str, delete: bool = False,
                      keep_claims: bool = False) -> tuple[WireTensor, ...]:
        claimed = [i for i, t in enumerate(tensors) if t.claim and not t.data]
        if not claimed:
            return tensors
        claims = [tensors[i].claim for i in claimed]
        try:
            blobs = await self._store.get(claims, delete)
        except ClaimMissing as exc:
            names = ", ".join(f"'{tensors[i].name}'" for i in claimed)
            raise ClaimMissing(f"{kind} {names}: its claim-checked bytes cannot be read: {exc}") from None
        redeemed = list(tensors)
        for i, blob in zip(claimed, blobs):
            redeemed[i] = replace(tensors[i], data=blob, claim=tensors[i].claim if keep_claims else "")
        return tuple(redeemed)


def claims_of(tensors: Sequence[WireTensor]) -> list[str]:
    return [t.claim for t in tensors if t.claim]


class NoClaims:
    """A process without a claim store: sends everything inline, and any claim
    it receives is refused with a clear error."""

    async def stash_request(self, request: Request, claim_outputs: bool) -> Request:
        return request

    async def stash_response(self, response: Response, request: Request | None) -> Response:
        return response

    async def redeem_request(self, request: Request) -> Request:
        _refuse(request.inputs, "input")
        return request

    async def redeem_response(self, response: Response) -> Response:
        _refuse(response.outputs, "output")
        return response

    async def release(self, request: Request) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _refuse(tensors: Sequence[WireTensor], kind: str) -> None:
    for tensor in tensors:
        if tensor.claim:
            raise ClaimMissing(f"{kind} '{tensor.name}' is claim-checked ('{tensor.claim}'), but this process "
                               "has no claim store: start it with --claim-check-store")
