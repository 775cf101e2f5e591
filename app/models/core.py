from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from steady.server.models.base import Base, UTCDateTime, utcnow
from steady.worker.contract.protocol import RunStatus, StudyStatus


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class DashboardSession(Base):
    """A dashboard login: the browser holds only the random session id; its hash is stored here."""

    __tablename__ = "dashboard_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    id_hash: Mapped[str] = mapped_column(String(64), unique=True)
    token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Study(Base):
    __tablename__ = "studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16), default="managed")
    status: Mapped[str] = mapped_column(String(16), default=StudyStatus.queued.value, index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    suite: Mapped[str | None] = mapped_column(String(200), nullable=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The token that created the study: it (and admins) may change it; every user may read it.
    owner_token_id: Mapped[int | None] = mapped_column(
        ForeignKey("api_tokens.id", ondelete="SET NULL"), nullable=True, index=True
    )

    # The study's code (a content-addressed archive, see CodeArchive), its git commit and whether
    # the work tree had uncommitted changes; NULL for built-in workloads.
    code_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    code_git_commit: Mapped[str | None] = mapped_column(String(64), nullable=True)
    code_dirty: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    # Why the study ended as it did, or what is wrong with its data (e.g. metrics no run logged).
    status_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Where repeats parted, per pair of runs, as `steady localize` found it (reports.localizations)
    localizations: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)

    runs: Mapped[list[Run]] = relationship(back_populates="study", lazy="raise", passive_deletes=True)


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    labels: Mapped[list[str]] = mapped_column(JSON, default=list)
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    engine: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # protocol.EngineJob
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"), nullable=True)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # The request id of the last lease this worker was granted and its run: a repeated lease
    # request (its answer was lost) gets the same run back instead of a second one.
    lease_request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_run_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Quarantined (leases no run of a study that respects quarantine) since when, by whom, why, and the
    # fleet check that set it if one did; the last lift. Every change is a WorkerEvent too.
    quarantined_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    quarantined_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    quarantine_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    quarantine_study_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    quarantine_lifted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    quarantine_lifted_by: Mapped[str | None] = mapped_column(String(200), nullable=True)


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        Index("ix_runs_status_id", "status", "id"),
        Index("ix_runs_study_id_status", "study_id", "status"),
        Index("ix_runs_pinned_worker_status", "pinned_worker", "status"),
        Index("ix_runs_status_pinned_until", "status", "pinned_until"),
        # what a lease reads: its candidates' blocks, its worker's runs, runs past their time limit (0021)
        Index("ix_runs_study_id_seed", "study_id", "seed"),
        Index("ix_runs_worker_id_status", "worker_id", "status"),
        Index("ix_runs_status_time_limit_at", "status", "time_limit_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    seed: Mapped[int] = mapped_column(BigInteger)
    repeat: Mapped[int] = mapped_column(Integer)
    determinism: Mapped[str] = mapped_column(String(16))
    stack: Mapped[str] = mapped_column(String(200))
    framework: Mapped[str] = mapped_column(String(32))
    required_labels: Mapped[list[str]] = mapped_column(JSON, default=list)
    # The id of the only worker that may lease the run (a fleet check), and until when it may; past
    # pinned_until a run still queued is failed with the reason. No foreign key: a deleted worker's
    # pinned runs must stay pinned, not become anyone's.
    pinned_worker: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pinned_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    status: Mapped[str] = mapped_column(String(16), default=RunStatus.queued.value)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    # The points and distinct metric keys of the current attempt's chunks, kept with every chunk written or
    # deleted (steady.server.metrics.repository), so a metric batch checks the run's limits without reading them
    stored_points: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    stored_keys: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lease_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # SHA-256 of the run-scoped credential issued with the current lease (steady.server.lifecycle.credentials)
    run_token_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id", ondelete="SET NULL"), nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    progress_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # the engine job (Slurm array task, pod) of the worker holding / last holding the lease
    engine: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # Leased at + the spec's time limit + grace: the reaper fails a run still running past it.
    time_limit_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The request id of the last complete/fail/release applied and the status it produced.
    transition_request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    transition_status: Mapped[str | None] = mapped_column(String(16), nullable=True)

    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    digests: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    determinism_applied: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    timings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    final_metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # params, tags, run name and client-side status written through the MLflow-compatible endpoint
    mlflow: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    failure_kind: Mapped[str | None] = mapped_column(String(16), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    stderr_tail: Mapped[str | None] = mapped_column(Text, nullable=True)
    argv: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)  # a command's argv as run (placeholders filled)
    # protocol.MetricConflicts: values logged twice, differently, for one (key, step); the first was kept
    metric_conflicts: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    # Excluded by a person (bad data): kept and shown, never judged. Who, when and why.
    excluded_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    excluded_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    excluded_reason: Mapped[str | None] = mapped_column(Text, nullable=True)

    study: Mapped[Study] = relationship(back_populates="runs", lazy="raise")


class Launch(Base):
    """A batch job of agents started for a study by ``steady launch`` (Slurm array, Kubernetes Job).

    A record for people (``steady status``, the study page); the leases, not this table,
    decide which run goes where.
    """

    __tablename__ = "launches"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"), index=True)
    engine: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str] = mapped_column(String(200))
    tasks: Mapped[int] = mapped_column(Integer)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class StudyReport(Base):
    """A study's report, computed in the background once it settles, for one study version.

    ``version`` names everything the report reads (status, run counts, last finish, last
    change); a reader whose current version differs computes afresh. ``body`` is the report
    as zlib-compressed JSON (non-finite floats included, which PostgreSQL's json type refuses).
    ``body`` is None when the study had nothing to report at that version.
    """

    __tablename__ = "study_reports"

    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[str] = mapped_column(String(500))
    body: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    computed_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    compute_seconds: Mapped[float] = mapped_column(Float, default=0.0)


class MetricChunk(Base):
    """A columnar chunk of one metric series: little-endian int64 steps and float64 values.

    One row per (run, attempt, batch seq, key). Only chunks of the run's current attempt are
    read, so a re-queued run never mixes the points of an abandoned attempt with its own.
    """

    __tablename__ = "metric_chunks"
    __table_args__ = (
        UniqueConstraint("run_id", "attempt", "seq", "key"),
        # also a metric batch's lookup of each of its keys (runs.stored_points/stored_keys hold the usage)
        Index("ix_metric_chunks_run_id_key", "run_id", "key"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(BigInteger)
    key: Mapped[str] = mapped_column(String(200))
    n: Mapped[int] = mapped_column(Integer)
    step_min: Mapped[int] = mapped_column(BigInteger)
    step_max: Mapped[int] = mapped_column(BigInteger)
    steps: Mapped[bytes] = mapped_column(LargeBinary)
    values: Mapped[bytes] = mapped_column(LargeBinary)
    # the type the values were logged in (stored as float64 either way); NULL: float64
    dtype: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # values parsed from printed text: the unit of their last printed digit (1e-4 for "0.1234"); NULL: binary floats
    resolution: Mapped[float | None] = mapped_column(Float, nullable=True)


class CodeArchive(Base):
    """A study's code: a deterministic tar.gz named by its SHA-256 (steady.worker.contract.codepack).

    ``files`` lists its regular files, so a spec's entrypoint is checked without reading the
    archive. The bytes live in the store named by ``store``: ``filesystem`` (a file under the
    data directory) or ``database`` (``code_chunks`` rows).
    """

    __tablename__ = "code_archives"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    files: Mapped[list[str]] = mapped_column(JSON)
    store: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class CodeChunk(Base):
    """One piece (at most 1 MiB) of an archive kept in the database (STEADY_CODE_STORE=database)."""

    __tablename__ = "code_chunks"

    sha256: Mapped[str] = mapped_column(ForeignKey("code_archives.sha256", ondelete="CASCADE"), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class StudyStage(Base):
    """One stage of an adaptive study (a study with a seed budget, ``steady.server.studies.adaptive``).

    Stage 1 holds the spec's seeds; each later stage the seeds the server added after the
    previous stage's seed-stability verdict stayed inconclusive. ``decisions`` is what the stage
    decided per (metric, determinism, stack): seeds judged, information fraction, boundary,
    statistic and decision; ``outcome`` is "continue", "conclusive", "budget_spent" or "time_spent" (the
    time budget ended the study before its last stage) once judged.
    """

    __tablename__ = "study_stages"
    __table_args__ = (UniqueConstraint("study_id", "stage"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"), index=True)
    stage: Mapped[int] = mapped_column(Integer)
    seeds: Mapped[list[int]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    judged_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)
    decisions: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)


class LocalizationJob(Base):
    """A request to localize where two repeats part, replayed by a worker (``steady.server.lifecycle.localizing``).

    Leased like a run: ``pending → running`` for exactly one worker (a conditional UPDATE), heartbeats
    extend the lease, an expired lease goes back to ``pending`` (once) or fails. The answer itself is kept
    where `steady localize` keeps it (``Study.localizations``); ``result`` is a copy for the job's own page.
    """

    __tablename__ = "localization_jobs"
    __table_args__ = (Index("ix_localization_jobs_status_id", "status", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"), index=True)
    run_a: Mapped[int] = mapped_column(Integer)
    run_b: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    required_labels: Mapped[list[str]] = mapped_column(JSON, default=list)
    step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # known from the runs' step digests
    requested_by: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"), nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    lease_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    time_limit_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id", ondelete="SET NULL"), nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    transition_request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
