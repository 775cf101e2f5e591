"""A per-process memory of bearer tokens already checked, for a few seconds.

Keyed by the token's SHA-256 (the secret itself is never kept). Only tokens found valid are
remembered: a token created a moment ago, in any process, works at once. A revocation through
the API clears the memory of the process that served it at once (``invalidate``); every other
process forgets the token within ``ttl_s`` seconds (``STEADY_TOKEN_CACHE_SECONDS``, default 5).

A lookup that started before an invalidation cannot put its (possibly stale) answer back in:
``generation`` counts invalidations, and ``put`` is refused when it changed since the lookup began.

A token that many requests carry at once (a fleet of agents sharing one worker token) is looked up
once when its entry expires: ``once`` lets the requests that miss meanwhile wait for that lookup
instead of each making its own (with a thousand agents, a thousand lookups every ``ttl_s``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
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
        # lookups in progress by (lane, digest), on the event loop that started them
        self._lookups: dict[tuple[str, str], asyncio.Task] = {}

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

    async def once(self, digest: str, look_up: Callable[[], Awaitable[T]], *, lane: str = "") -> T:
        """The value for ``digest`` from ``look_up()``, remembered; a lookup of the same digest in the same
        ``lane`` (the threads and connections it runs on) already in progress on this event loop is awaited
        instead of starting another (its answer or its error). With the cache off (``ttl_s`` 0) every
        caller looks up for itself."""
        if self.ttl_s <= 0:
            return await look_up()
        loop = asyncio.get_running_loop()
        key = (lane, digest)
        task = self._lookups.get(key)
        if task is None or task.get_loop() is not loop:
            generation = self.generation

            async def run() -> T:
                try:
                    value = await look_up()
                    self.put(digest, value, generation)
                    return value
                finally:
                    if self._lookups.get(key) is task:
                        del self._lookups[key]

            task = self._lookups[key] = loop.create_task(run())
        # shielded: one waiter cancelled (its client went away) does not cancel the others' lookup
        return await asyncio.shield(task)

    def invalidate(self) -> None:
        """Forget every token (a token was revoked in this process)."""
        with self._lock:
            self.generation += 1
            self._entries.clear()
