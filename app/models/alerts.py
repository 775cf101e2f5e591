"""Alerting: rules, suite baselines, alerts, webhooks, the delivery outbox, study evaluations."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from steady.server.models.base import Base, UTCDateTime, utcnow


class AlertRule(Base):
    """A rule is scoped to one study (``study_id``), one suite (``suite``) or everything (neither)."""

    __tablename__ = "alert_rules"
    __table_args__ = (Index("ix_alert_rules_scope", "suite", "study_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(32))
    metric: Mapped[str | None] = mapped_column(String(200), nullable=True)
    severity: Mapped[str] = mapped_column(String(16), default="warning")
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    study_id: Mapped[int | None] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"), nullable=True)
    suite: Mapped[str | None] = mapped_column(String(200), nullable=True)
    source: Mapped[str] = mapped_column(String(16), default="api")  # api | spec
    owner_token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"),
                                                       nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class SuiteBaseline(Base):
    __tablename__ = "suite_baselines"

    suite: Mapped[str] = mapped_column(String(200), primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    stack: Mapped[str | None] = mapped_column(String(200), nullable=True)
    set_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    owner_token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"),
                                                       nullable=True)
    # the frozen snapshot the comparisons read (None: a baseline set before snapshots existed)
    snapshot_id: Mapped[int | None] = mapped_column(ForeignKey("baseline_snapshots.id", ondelete="SET NULL"),
                                                    nullable=True)


class BaselineSnapshot(Base):
    """One version of a suite's baseline: its runs' results frozen as canonical JSON.

    ``digest`` is the SHA-256 of the canonical JSON (``steady.server.alerts.baselines.canonical``);
    ``body`` is that JSON zlib-compressed. Rows are never updated: moving the baseline adds
    a version, with who moved it, when and why. Clearing it adds one too (``action`` "cleared",
    no content: ``digest`` and ``body`` NULL), so a suite that went without a baseline shows in
    its history.
    """

    __tablename__ = "baseline_snapshots"
    __table_args__ = (UniqueConstraint("suite", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    suite: Mapped[str] = mapped_column(String(200), index=True)
    version: Mapped[int] = mapped_column(Integer)
    study_id: Mapped[int | None] = mapped_column(ForeignKey("studies.id", ondelete="SET NULL"), nullable=True)
    stack: Mapped[str | None] = mapped_column(String(200), nullable=True)
    action: Mapped[str] = mapped_column(String(16), default="set", server_default="set")  # set | cleared
    digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    body: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    n_runs: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_by_token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"),
                                                            nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class Alert(Base):
    """One alert per dedupe key (rule × study-or-suite × metric × group); evaluations update it."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_state_id", "state", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dedupe_key: Mapped[str] = mapped_column(String(64), unique=True)
    rule_id: Mapped[int] = mapped_column(ForeignKey("alert_rules.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    severity: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))  # firing | resolved
    study_id: Mapped[int | None] = mapped_column(ForeignKey("studies.id", ondelete="SET NULL"), nullable=True,
                                                 index=True)
    suite: Mapped[str | None] = mapped_column(String(200), nullable=True, index=True)
    metric: Mapped[str | None] = mapped_column(String(200), nullable=True)
    group: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    summary: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    link: Mapped[str] = mapped_column(String(500))
    first_fired_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_fired_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    evaluated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    fire_count: Mapped[int] = mapped_column(Integer, default=1)
    acked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    acked_by: Mapped[str | None] = mapped_column(String(200), nullable=True)


class Webhook(Base):
    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    url: Mapped[str] = mapped_column(String(2000))
    secret: Mapped[str] = mapped_column(String(200))
    # Which alert transitions are sent: any of "firing", "resolved".
    events: Mapped[list[str]] = mapped_column(JSON, default=list)
    min_severity: Mapped[str] = mapped_column(String(16), default="warning")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AlertDelivery(Base):
    """The outbox: one row per (webhook, alert transition); the dispatcher claims rows by lease."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (
        Index("ix_alert_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
        UniqueConstraint("webhook_id", "alert_id", "transition"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"), index=True)
    event: Mapped[str] = mapped_column(String(16))  # firing | resolved
    transition: Mapped[int] = mapped_column(Integer)  # the alert's fire_count·2 (+1 when resolved)
    body: Mapped[str] = mapped_column(Text)  # the exact JSON sent; the signature covers these bytes
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | delivered | dead
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class StudyEvaluation(Base):
    """A study's alert evaluation: requested when it finishes, run by the dispatcher; the latest
    verdict numbers (for /metrics) are kept in ``summary``."""

    __tablename__ = "study_evaluations"

    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)  # pending | done | error
    requested_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    evaluated_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
