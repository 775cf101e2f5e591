"""The alert dispatcher: a background loop per API process (``steady.server.kit.background``), like the lease reaper.

Every tick it (1) runs requested study evaluations and (2) delivers due outbox rows. A
delivery is claimed with a conditional UPDATE that sets a lease (owner, expiry) — exactly one
process wins a row, however many API processes run — then POSTed outside any transaction,
then recorded while the lease is still ours. A process that dies holding a lease leaves the
row pending; another process (or this one after a restart) claims it when the lease
expires: delivery is at least once, and receivers should dedupe on ``X-Steady-Delivery``.
Failures retry with exponential backoff and jitter; after ``max_attempts`` the row is
``dead`` and stays in the table for inspection.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

import httpx

from steady.server import __version__
from steady.server.alerts import egress, jobs, repository, webhooks
from steady.server.alerts.settings import AlertSettings
from steady.server.kit.background import BackgroundLoop
from steady.server.kit.config import Settings
from steady.server.kit.db import Database
from steady.server.models import AlertDelivery, Webhook, utcnow

log = logging.getLogger("steady.alerts")


def backoff_seconds(attempts: int, cfg: AlertSettings, rand: random.Random | None = None) -> float:
    """Wait before retry number ``attempts`` (1-based): base · 2^(attempts−1), capped, ±20% jitter."""
    base = min(cfg.backoff_max_seconds, cfg.backoff_base_seconds * 2 ** max(0, attempts - 1))
    return base * (rand or random).uniform(0.8, 1.2)


class TokenBucket:
    """Deliveries per webhook: ``rate`` per second on average, bursts up to ``burst``.

    Per dispatcher (one per API process). A delivery over the limit waits; it is not dropped.
    """

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self._state: dict[int, tuple[float, float]] = {}  # webhook id -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, key: int) -> float:
        """Take one token: 0.0 when granted, else the seconds until one is available (none taken)."""
        with self._lock:
            now = self.clock()
            tokens, at = self._state.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._state[key] = (tokens - 1.0, now)
                return 0.0
            self._state[key] = (tokens, now)
            return (1.0 - tokens) / self.rate


class Dispatcher:
    def __init__(self, database: Database, settings: Settings, cfg: AlertSettings | None = None, *,
                 resolver: egress.Resolver | None = None, transport: httpx.BaseTransport | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.database, self.settings = database, settings
        self.cfg = cfg or AlertSettings()
        self.owner = f"dispatcher-{uuid.uuid4().hex[:16]}"
        self.resolver = resolver
        self.limiter = TokenBucket(self.cfg.webhook_rate_per_minute / 60.0, self.cfg.webhook_burst, clock)
        self._loop = BackgroundLoop("alert dispatcher", self.tick, interval=self.cfg.dispatch_interval_seconds,
                                    logger=log)
        self._http = httpx.Client(timeout=self.cfg.delivery_timeout_seconds, follow_redirects=False,
                                  headers={"User-Agent": f"steady/{__version__}"}, transport=transport)

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop(timeout=self.cfg.delivery_timeout_seconds + 5)
        self._http.close()

    def tick(self) -> int:
        jobs.run_pending_evaluations(self.database, base_url=self.settings.base_url)
        return self.deliver_due()

    def deliver_due(self) -> int:
        """Claim and send due deliveries; the number delivered."""
        now = utcnow()
        with self.database.read() as session:
            candidates = repository.due_deliveries(session, now, self.cfg.deliveries_per_tick)
        delivered = 0
        for delivery_id, webhook_id in candidates:
            if self._loop.stopping:
                break
            wait = self.limiter.take(webhook_id)
            if wait > 0:  # over this webhook's rate: the delivery waits its turn (not an attempt)
                with self.database.write() as session:
                    repository.defer_delivery(session, delivery_id, utcnow() + timedelta(seconds=wait))
                continue
            with self.database.write() as session:
                if not repository.claim_delivery(session, delivery_id, self.owner, utcnow(),
                                                 self.cfg.delivery_lease_seconds):
                    continue
                row = session.get(AlertDelivery, delivery_id)
                hook = session.get(Webhook, row.webhook_id) if row is not None else None
                job = None if row is None or hook is None else (row.body, row.event, row.attempts, hook.url,
                                                               hook.secret, row.alert_id)
            if job is None:
                continue
            delivered += self._send(delivery_id, *job)
        return delivered

    def _send(self, delivery_id: int, body: str, event: str, attempts: int, url: str, secret: str,
              alert_id: int) -> int:
        raw = body.encode()
        status, error = None, None
        try:
            # resolved once and checked; the request goes to that address (no second lookup)
            target = egress.resolve(url, allow_private=self.settings.allow_private_webhooks, resolver=self.resolver)
        except egress.RefusedTarget as exc:
            target, error = None, f"refused: {exc}"
        if target is not None:
            try:
                response = self._http.post(target.request_url(), content=raw, extensions=target.extensions(), headers={
                    "Host": target.host_header(),
                    "Content-Type": "application/json",
                    "X-Steady-Signature": webhooks.sign(secret, raw),
                    "X-Steady-Event": event,
                    "X-Steady-Delivery": str(delivery_id),
                    "X-Steady-Alert": str(alert_id),
                })
                status = response.status_code
                if not 200 <= status < 300:
                    error = f"HTTP {status}: {response.text[:500]}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"[:2000]
        now = utcnow()
        attempts += 1
        with self.database.write() as session:
            if error is None:
                repository.finish_delivery(session, delivery_id, self.owner, status="delivered", attempts=attempts,
                                           delivered_at=now, last_status_code=status, last_error=None)
                return 1
            dead = attempts >= self.cfg.max_attempts
            repository.finish_delivery(
                session, delivery_id, self.owner, attempts=attempts, last_status_code=status, last_error=error,
                status="dead" if dead else "pending",
                next_attempt_at=now + timedelta(seconds=backoff_seconds(attempts, self.cfg)),
            )
            log.info("webhook delivery %s attempt %s failed: %s", delivery_id, attempts, error)
        return 0
