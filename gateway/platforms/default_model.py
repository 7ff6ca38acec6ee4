"""The model a platform's single-model route serves: the one configured, else
the repository's only ready model (as Triton picks it)."""

from __future__ import annotations

from gateway.catalog import ModelCatalog
from gateway.errors import InvalidRequest


def default_model(catalog: ModelCatalog, configured: str, flag: str) -> str:
    if configured:
        return configured
    ready = sorted({row["name"] for row in catalog.states(ready_only=True)})
    if len(ready) != 1:
        raise InvalidRequest(f"{len(ready)} models are ready: name the one this route serves with {flag}")
    return ready[0]
