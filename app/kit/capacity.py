"""Capacity of its own for the worker protocol, and a per-user limit on heavy reads.

One API process serves users and a fleet of workers. A user's heavy read (a report, bands, a
compare, a series export) can hold a thread and a database connection for seconds; if the worker
protocol took its threads and connections from the same pools, enough such reads would make
heartbeats wait past their lease, and another user's run would be re-queued.

- :class:`ProtocolLane`: lease, heartbeat, complete, fail and release, the worker's registration,
  the lease reaper and the group committer of metric batches run on threads of their own
  (``STEADY_PROTOCOL_THREADS``, an AnyIO limiter apart from the shared thread pool) and on
  database connections of their own (a pool of that many connections, plus the committer's and
  the reaper's). No user request takes either. ``/healthz`` answers from the same lane.
- :class:`HeavyGate`: the heavy user reads run at most ``STEADY_HEAVY_PER_USER`` at a time per
  token and ``STEADY_HEAVY_TOTAL`` in all per process; one more is answered 429 at once, with a
  ``Retry-After`` of about how long such a read takes here, never queued on a thread.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from anyio import CapacityLimiter, to_thread

from steady.server.kit.db import Database
from steady.server.kit.errors import TooManyRequests

T = TypeVar("T")

# The protocol's own connections: one per thread, and one each for the group committer and the reaper.
BACKGROUND_CONNECTIONS = 2


class ProtocolLane:
    """The worker protocol's threads and database connections. Made in the application's lifespan
    (an AnyIO limiter belongs to the running event loop)."""

    def __init__(self, database: Database, threads: int) -> None:
        # no round trip before each of the protocol's statements: its pool recycles its connections instead,
        # and a request that finds one the server closed is answered by its route (heartbeats) or retried by
        # the agent (a 503), on a pool emptied of the closed ones
        self.database = database.own_pool(threads + BACKGROUND_CONNECTIONS, pre_ping=False)
        self.limiter = CapacityLimiter(threads)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on one of the protocol's threads."""
        return await to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def write(self, work: Callable[..., T], *args: Any) -> T:
        """``work(session, *args)`` in one write session on the protocol's connections, opened, used and
        committed in one thread, so it may queue for the process's SQLite write lock."""
        def call() -> T:
            with self.database.write(queue=True) as session:
                return work(session, *args)

        return await self.run(call)

    def dispose(self) -> None:
        self.database.dispose()


class HeavyGate:
    """How many heavy reads run now, per token and in all; admits one or refuses it with 429."""

    def __init__(self, per_user: int, total: int) -> None:
        self.per_user, self.total = per_user, total
        self._lock = threading.Lock()
        self._running: dict[int, int] = {}
        self._all = 0
        self._typical_s = 1.0  # a moving average of how long a heavy read takes here

    def retry_after_s(self) -> int:
        return min(60, max(1, math.ceil(self._typical_s)))

    def enter(self, token_id: int) -> float:
        """Admit a heavy read of ``token_id``'s (returns when it started) or raise ``TooManyRequests``."""
        with self._lock:
            mine = self._running.get(token_id, 0)
            if mine >= self.per_user:
                raise self._refusal(f"this token already has {mine} heavy read(s) in progress (reports, bands, "
                                    f"compares, series), the limit per token (STEADY_HEAVY_PER_USER)")
            if self._all >= self.total:
                raise self._refusal(f"the server has {self._all} heavy read(s) in progress, its limit "
                                    "(STEADY_HEAVY_TOTAL)")
            self._running[token_id] = mine + 1
            self._all += 1
        return time.monotonic()

    def leave(self, token_id: int, started: float) -> None:
        took = time.monotonic() - started
        with self._lock:
            left = self._running.get(token_id, 0) - 1
            if left > 0:
                self._running[token_id] = left
            else:
                self._running.pop(token_id, None)
            self._all -= 1
            self._typical_s = 0.8 * self._typical_s + 0.2 * took

    def _refusal(self, why: str) -> TooManyRequests:
        err = TooManyRequests(f"{why}; retry after {self.retry_after_s()} s", code="too_many_heavy_reads")
        err.retry_after_s = self.retry_after_s()
        return err

    def in_progress(self) -> int:
        return self._all
