"""A worker's history (quarantine changes, fleet-check results) and studies submitted on a schedule."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from steady.server.models.base import Base, UTCDateTime, utcnow


class WorkerEvent(Base):
    """One line of a worker's history: ``quarantined``, ``released`` (by whom, why) or ``check`` (a fleet
    check's result for this worker: the study, its verdict, the first step where its runs part from its peers).

    Rows are only added, never changed, so the history is the record of who did what and when.
    """

    __tablename__ = "worker_events"
    __table_args__ = (
        Index("ix_worker_events_worker_id_id", "worker_id", "id"),
        Index("ix_worker_events_kind_id", "kind", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker_id: Mapped[int] = mapped_column(ForeignKey("workers.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))  # quarantined | released | check
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    actor: Mapped[str | None] = mapped_column(String(200), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    study_id: Mapped[int | None] = mapped_column(ForeignKey("studies.id", ondelete="SET NULL"), nullable=True)
    verdict: Mapped[str | None] = mapped_column(String(32), nullable=True)
    first_divergent_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class StudySchedule(Base):
    """A study spec submitted again and again: every ``every_seconds``, or daily at ``daily_at`` (UTC "HH:MM").

    ``next_due_at`` is the claim: the API process whose conditional UPDATE moves it forward from the value
    it read submits the study, so a due schedule fires once however many processes look at it.
    """

    __tablename__ = "study_schedules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    every_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    daily_at: Mapped[str | None] = mapped_column(String(5), nullable=True)
    next_due_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    last_fired_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_study_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    fired_count: Mapped[int] = mapped_column(Integer, default=0)
    owner_token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"),
                                                       nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
