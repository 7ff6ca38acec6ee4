"""Triton's response cache: a model with ``response_cache { enable: true }`` has
its answers kept by the hash of what it was asked (``key.py``), in this
worker's memory (``local.py``) or in Redis for the whole fleet
(``redis_cache.py``), chosen by ``--cache-config`` (``settings.py``). A hit is
answered without running the model (``cached.py``). Sequences and decoupled
models are never cached."""

from workers.cache.store import ResponseCache

__all__ = ["ResponseCache"]
