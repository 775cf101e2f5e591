"""Alerting knobs, read from ``STEADY_ALERT_*`` environment variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class AlertSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STEADY_ALERT_", extra="ignore")

    # The dispatcher wakes this often to run pending evaluations and due deliveries.
    dispatch_interval_seconds: float = Field(1.0, gt=0)
    # Retry n waits min(backoff_max, backoff_base · 2^(n−1)) · U(0.8, 1.2) seconds.
    backoff_base_seconds: float = Field(5.0, gt=0)
    backoff_max_seconds: float = Field(3600.0, gt=0)
    # After this many failed attempts a delivery is marked dead (kept for inspection).
    max_attempts: int = Field(15, ge=1)
    delivery_timeout_seconds: float = Field(10.0, gt=0)
    # A claimed delivery whose process died is claimable again after this long.
    delivery_lease_seconds: float = Field(60.0, gt=0)
    deliveries_per_tick: int = Field(50, ge=1)
    # Deliveries per webhook (per API process): this many a minute on average, bursts up to
    # webhook_burst; more wait their turn (never dropped), so no user can flood a receiver.
    webhook_rate_per_minute: float = Field(30.0, gt=0)
    webhook_burst: int = Field(10, ge=1)
    # /metrics exposes the latest evaluation of at most this many (most recent) studies.
    metrics_max_studies: int = Field(200, ge=1)
