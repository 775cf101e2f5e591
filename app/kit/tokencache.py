"""A per-process memory of bearer tokens already checked, for a few seconds.

Keyed by the token's SHA-256 (the secret itself is never kept). Only tokens found valid are
remembered: a token created a moment ago, in any process, works at once. A revocation through
the API clears the memory of the process that served it at once (``invalidate``); every other
process forgets the token within ``ttl_s`` seconds (``STEADY_TOKEN_CACHE_SECONDS``, default 5).

A lookup that started before an invalidation cannot put its (possibly stale) answer back in:
``generation`` counts invalidations, and ``put`` is refused when it changed since the lookup began.
"""

from __future__ import annotations

import threading
import time
from typing import Generic, TypeVar

T = TypeVar("T")

MAX_ENTRIES = 10_000


class TokenCache(Generic[T]):
    def __init__(self, ttl_s: float, *, clock=time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[str, tuple[float, T]] = {}
        self._lock = threading.Lock()
        self.generation = 0

    def get(self, digest: str) -> T | None:
        if self.ttl_s <= 0:
            return None
        entry = self._entries.get(digest)
        if entry is None:
            return None
        expires, value = entry
        if self._clock() >= expires:
            self._entries.pop(digest, None)
            return None
        return value

    def put(self, digest: str, value: T, generation: int) -> None:
        """Remember ``value``, unless an invalidation happened since ``generation`` was read."""
        if self.ttl_s <= 0:
            return
        with self._lock:
            if generation != self.generation:
                return
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[digest] = (self._clock() + self.ttl_s, value)

    def invalidate(self) -> None:
        """Forget every token (a token was revoked in this process)."""
        with self._lock:
            self.generation += 1
            self._entries.clear()
