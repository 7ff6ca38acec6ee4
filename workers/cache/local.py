"""Cached answers in this worker's memory, the least recently used evicted past
``max_bytes`` (keys and values counted), as Triton's local cache is bounded."""

from __future__ import annotations

from collections import OrderedDict


class LocalCache:
    kind = "local"

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()
        self.size_bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: bytes) -> bytes | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    async def put(self, key: bytes, value: bytes) -> None:
        size = len(key) + len(value)
        if size > self.max_bytes:
            return  # larger than the whole cache: not kept, nothing evicted for it
        old = self._entries.pop(key, None)
        if old is not None:
            self.size_bytes -= len(key) + len(old)
        while self._entries and self.size_bytes + size > self.max_bytes:
            evicted_key, evicted = self._entries.popitem(last=False)
            self.size_bytes -= len(evicted_key) + len(evicted)
            self.evictions += 1
        self._entries[key] = value
        self.size_bytes += size

    async def aclose(self) -> None:
        self._entries.clear()
        self.size_bytes = 0
