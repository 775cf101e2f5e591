"""The one background loop of an API process: the lease reaper, the alert dispatcher and the report
cacher each run a ``BackgroundLoop``.

Every ``interval`` seconds (±``jitter``, so API processes started together drift apart) the loop
calls ``tick``. A tick that raises is logged — one line when the database is unavailable (an
outage is expected and said once per try, ``steady.server.kit.db.unavailable``), with its traceback otherwise —
and the loop waits longer before
the next one — ``interval · 2^k`` after ``k`` failures in a row, capped at ``max_backoff`` — so a
database that is down is not hammered; the first tick that succeeds brings the interval back.
``stop`` ends the loop at its next wait. The wait and the random source are injectable, so tests
drive the loop on the calling thread without sleeping.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

from steady.server.kit.db import database_message, unavailable

log = logging.getLogger("steady")

# wait(seconds) -> True when the loop should stop (threading.Event.wait's contract)
Wait = Callable[[float], bool]


class BackgroundLoop:
    def __init__(self, name: str, tick: Callable[[], object], *, interval: float, jitter: float = 0.1,
                 max_backoff: float = 60.0, logger: logging.Logger | None = None,
                 wait: Wait | None = None, rand: random.Random | None = None) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, not {interval}")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), not {jitter}")
        self.name, self.tick, self.interval, self.jitter = name, tick, interval, jitter
        self.max_backoff = max(max_backoff, interval)
        self.log = logger or log
        self._stop = threading.Event()
        self._wait = wait or self._stop.wait
        self._rand = rand or random.Random()
        self._thread: threading.Thread | None = None
        self.failures = 0  # ticks failed in a row

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def next_delay(self) -> float:
        """Seconds before the next tick: the interval, doubled per failure in a row (capped), ±jitter."""
        base = min(self.max_backoff, self.interval * 2.0 ** self.failures)
        return base * self._rand.uniform(1.0 - self.jitter, 1.0 + self.jitter)

    def run(self) -> None:
        """Wait, tick, repeat until stopped (the thread's body; tests call it with an injected wait)."""
        while not self._stop.is_set() and not self._wait(self.next_delay()):
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception as exc:  # the database may be down: log, back off, try again
                self.failures += 1
                retry = min(self.max_backoff, self.interval * 2.0 ** self.failures)
                if unavailable(exc):
                    self.log.warning("%s: database unavailable (%d in a row): %s; next try in about %.3g s",
                                     self.name, self.failures, database_message(exc), retry)
                else:
                    self.log.exception("%s: tick failed (%d in a row); next try in about %.3g s", self.name,
                                       self.failures, retry)
            else:
                self.failures = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"steady-{self.name.replace(' ', '-')}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=timeout)
