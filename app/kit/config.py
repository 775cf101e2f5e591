"""Settings: one ``Settings`` object read from ``STEADY_*`` environment variables."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STEADY_", extra="ignore")

    # Where the embedded database, tokens of the demo and other local state live.
    data_dir: Path = Path(".steady")
    # SQLAlchemy URL; empty means the embedded SQLite file ``<data_dir>/steady.db``.
    database_url: str = ""

    host: str = "127.0.0.1"
    port: int = 8000
    # Address users should open; shown in links of alerts and the CLI.
    public_url: str = ""

    # Leases: a run whose lease is not renewed within lease_seconds goes back to the queue.
    lease_seconds: float = Field(60.0, gt=0)
    heartbeat_seconds: float = Field(10.0, gt=0)
    reaper_interval_seconds: float = Field(5.0, gt=0)
    # How often each API process looks for due study schedules (steady.server.studies.schedules).
    schedule_interval_seconds: float = Field(15.0, gt=0)
    # Reports of settled studies are computed in the background and cached; 0 turns it off.
    report_cache_interval_seconds: float = Field(2.0, ge=0)
    # Runs one worker may hold at once; a lease request beyond it is answered 429.
    max_leases_per_worker: int = Field(8, ge=1)
    # A run still running this long past its spec's time_limit_s is failed (kind timeout) by
    # the server, whatever its worker's heartbeats say.
    time_limit_grace_seconds: float = Field(60.0, ge=0)

    # Capacity (docs/deploy.md, "Capacity"). The worker protocol (lease, heartbeat, metrics, complete)
    # runs on this many threads and database connections of its own, which no user request takes.
    protocol_threads: int = Field(8, ge=1, le=256)
    # Heavy reads (report, bands, compare, a run's series) in progress at once, per token and in all
    # per API process; one more is answered 429 with Retry-After.
    heavy_per_user: int = Field(2, ge=1)
    heavy_total: int = Field(12, ge=1)

    # Limits on input.
    max_runs_per_study: int = Field(2000, ge=1)
    max_batch_points: int = Field(200_000, ge=1)
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    max_page_size: int = 500
    # Per-run data: distinct metric keys and stored points (all keys) of one attempt.
    max_keys_per_run: int = Field(256, ge=1)
    max_points_per_run: int = Field(50_000_000, ge=1)

    # Study code archives (steady submit): where they are kept and how large one may be.
    # "filesystem": <data_dir>/code/ (one machine, or a shared volume); "database": chunks in the
    # database, so every API process behind a load balancer sees every archive (docs/deploy.md).
    code_store: Literal["filesystem", "database"] = "filesystem"
    max_code_bytes: int = Field(50 * 1024 * 1024, ge=1024)
    # What one archive may unpack to, enforced while it inflates (a compression bomb stops at its
    # budget): bytes of the tar stream, entries, and unpacked bytes per archive byte above 16 MiB.
    # Workers read the same names from their environment.
    max_code_unpacked_bytes: int = Field(1024 * 1024 * 1024, ge=1024)
    max_code_files: int = Field(100_000, ge=1)
    max_code_ratio: float = Field(200.0, gt=1)
    # An upload whose client sends nothing for this long is answered 408 and its spool file removed.
    upload_stall_seconds: float = Field(30.0, gt=0)

    # SQLite only: PRAGMA synchronous. FULL: an acknowledged write survives power loss
    # (fsync of the WAL at every commit). NORMAL: it survives a crash of the process, but the
    # last commits before a power loss or kernel panic may be lost. See docs/deploy.md.
    sqlite_synchronous: Literal["FULL", "NORMAL"] = "FULL"

    # Dashboard: readable without a token when true (read-only).
    public_dashboard: bool = False
    # A dashboard login lasts this long (a server-side session, revoked on logout).
    session_ttl_seconds: float = Field(12 * 3600.0, gt=0)
    # Each API process remembers a bearer token it has checked for this long, so a request does not
    # look its token up again (0: look it up every time). Revoking a token through the API takes
    # effect at once in the process that revoked it and within this many seconds in the others
    # (and in a server when the token is revoked with the CLI). Created tokens work at once.
    token_cache_seconds: float = Field(5.0, ge=0, le=60)
    # Proxies trusted for X-Forwarded-Proto/-For (comma-separated addresses or networks, "*" for
    # any): only behind them does a request count as https (Secure cookie) or get a client address.
    forwarded_allow_ips: str = "127.0.0.1"
    # Webhook targets on loopback, link-local and private networks are refused unless true.
    allow_private_webhooks: bool = False

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'steady.db').resolve()}"

    @property
    def base_url(self) -> str:
        return self.public_url.rstrip("/") or f"http://{self.host}:{self.port}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
