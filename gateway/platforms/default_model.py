"""The model a platform's single-model route serves: the one configured, else the
repository's only model. Triton picks among the models ready at start; ferry's
readiness comes and goes with the fleet's heartbeats, so it picks from the
repository, and a model not ready yet is answered as any request to it is (503)."""

from __future__ import annotations

from gateway.catalog import ModelCatalog
from gateway.errors import InvalidRequest


def default_model(catalog: ModelCatalog, configured: str, flag: str) -> str:
    if configured:
        return configured
    names = catalog.names()
    if len(names) != 1:
        raise InvalidRequest(f"the repository has {len(names)} models: name the one this route serves with {flag}")
    return names[0]
