from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.models.base import Base, UTCDateTime, utcnow


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Study(Base):
    __tablename__ = "studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16), default="managed")
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    suite: Mapped[str | None] = mapped_column(String(200), nullable=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    runs: Mapped[list[Run]] = relationship(back_populates="study", lazy="raise", passive_deletes=True)


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    labels: Mapped[list[str]] = mapped_column(JSON, default=list)
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"), nullable=True)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        Index("ix_runs_status_id", "status", "id"),
        Index("ix_runs_study_id_status", "study_id", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    seed: Mapped[int] = mapped_column(BigInteger)
    repeat: Mapped[int] = mapped_column(Integer)
    determinism: Mapped[str] = mapped_column(String(16))
    stack: Mapped[str] = mapped_column(String(200))
    framework: Mapped[str] = mapped_column(String(32))
    required_labels: Mapped[list[str]] = mapped_column(JSON, default=list)

    status: Mapped[str] = mapped_column(String(16), default="queued")
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    lease_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id", ondelete="SET NULL"), nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    progress_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    digests: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    determinism_applied: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    timings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    final_metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    failure_kind: Mapped[str | None] = mapped_column(String(16), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    stderr_tail: Mapped[str | None] = mapped_column(Text, nullable=True)

    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    study: Mapped[Study] = relationship(back_populates="runs", lazy="raise")


class MetricChunk(Base):
    """A columnar chunk of one metric series: little-endian int64 steps and float64 values.

    One row per (run, attempt, batch seq, key). Only chunks of the run's current attempt are
    read, so a re-queued run never mixes the points of an abandoned attempt with its own.
    """

    __tablename__ = "metric_chunks"
    __table_args__ = (
        UniqueConstraint("run_id", "attempt", "seq", "key"),
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
