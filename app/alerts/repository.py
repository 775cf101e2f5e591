"""SQL of the alerting domain: rules, baselines, alerts, webhooks, the outbox, evaluations."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, and_, func, or_, select, update
from sqlalchemy.orm import Session

from steady.server.models import (
    Alert,
    AlertDelivery,
    AlertRule,
    BaselineSnapshot,
    Study,
    StudyEvaluation,
    Webhook,
    Worker,
)
from steady.server.kit.repository import paginate
from steady.server.runs import repository as runs_repo
from steady.worker.contract.protocol import StudyStatus

# --- rules -----------------------------------------------------------------------------------


def rules_for_study(session: Session, study: Study) -> list[AlertRule]:
    """Rules of the study itself, of its suite, and global rules (neither study nor suite)."""
    scope = [AlertRule.study_id == study.id, and_(AlertRule.study_id.is_(None), AlertRule.suite.is_(None))]
    if study.suite:
        scope.append(and_(AlertRule.study_id.is_(None), AlertRule.suite == study.suite))
    # system rules (a worker's quarantine, steady.server.alerts.quarantine) are not judged on studies
    return list(session.scalars(select(AlertRule).where(or_(*scope), AlertRule.source != "system")
                                .order_by(AlertRule.id)))


def find_rule(session: Session, *, study_id: int | None, suite: str | None, name: str) -> AlertRule | None:
    stmt = select(AlertRule).where(AlertRule.name == name)
    stmt = stmt.where(AlertRule.study_id == study_id if study_id is not None else AlertRule.study_id.is_(None))
    stmt = stmt.where(AlertRule.suite == suite if suite is not None else AlertRule.suite.is_(None))
    return session.scalars(stmt).first()


def list_rules(
    session: Session, *, study_id: int | None, suite: str | None, kind: str | None, limit: int, offset: int
) -> tuple[list[AlertRule], int]:
    stmt = select(AlertRule)
    if study_id is not None:
        stmt = stmt.where(AlertRule.study_id == study_id)
    if suite is not None:
        stmt = stmt.where(AlertRule.suite == suite)
    if kind is not None:
        stmt = stmt.where(AlertRule.kind == kind)
    return paginate(session, stmt, limit=limit, offset=offset, order_by=AlertRule.id)


# --- baselines and suite history -------------------------------------------------------------


def suite_studies(session: Session, suite: str, *, from_id: int | None, upto_id: int) -> list[Study]:
    """Finished (or open external) studies of a suite, oldest first, within [from_id, upto_id]."""
    stmt = select(Study).where(
        Study.suite == suite, Study.id <= upto_id, Study.status.in_((StudyStatus.completed.value, StudyStatus.open.value))
    )
    if from_id is not None:
        stmt = stmt.where(Study.id >= from_id)
    return list(session.scalars(stmt.order_by(Study.id)))


def final_metrics(session: Session, study_ids: Sequence[int]) -> list[tuple[int, str, str, dict[str, Any]]]:
    """(study_id, stack, determinism, final_metrics) of the completed runs of the studies."""
    return runs_repo.judged_final_metrics(session, study_ids)


def study_stacks(session: Session, study_id: int) -> list[str]:
    return runs_repo.stacks_of(session, study_id)


def next_snapshot_version(session: Session, suite: str) -> int:
    last = session.scalar(select(func.max(BaselineSnapshot.version)).where(BaselineSnapshot.suite == suite))
    return (last or 0) + 1


def snapshots_of_suite(session: Session, suite: str, *, limit: int, offset: int) -> tuple[list[BaselineSnapshot], int]:
    """Versions of the suite's baseline, newest first."""
    stmt = select(BaselineSnapshot).where(BaselineSnapshot.suite == suite)
    return paginate(session, stmt, limit=limit, offset=offset, order_by=BaselineSnapshot.version.desc())


# --- alerts ----------------------------------------------------------------------------------


def alert_by_key(session: Session, key: str) -> Alert | None:
    return session.scalars(select(Alert).where(Alert.dedupe_key == key)).first()


def firing_alerts_of_rule(session: Session, rule_id: int, *, suite: str | None, study_id: int | None) -> list[Alert]:
    stmt = select(Alert).where(Alert.rule_id == rule_id, Alert.state == "firing")
    stmt = stmt.where(Alert.suite == suite) if suite is not None else stmt.where(
        Alert.suite.is_(None), Alert.study_id == study_id
    )
    return list(session.scalars(stmt))


def list_alerts(
    session: Session, *, state: str | None, study_id: int | None, suite: str | None, rule_id: int | None,
    kind: str | None, limit: int, offset: int,
) -> tuple[list[Alert], int]:
    stmt = select(Alert)
    if state:
        stmt = stmt.where(Alert.state == state)
    if study_id is not None:
        stmt = stmt.where(Alert.study_id == study_id)
    if suite is not None:
        stmt = stmt.where(Alert.suite == suite)
    if rule_id is not None:
        stmt = stmt.where(Alert.rule_id == rule_id)
    if kind is not None:
        stmt = stmt.where(Alert.kind == kind)
    return paginate(session, stmt, limit=limit, offset=offset, order_by=Alert.id.desc())


def deliveries_of(session: Session, alert_id: int, *, limit: int, offset: int) -> tuple[list[AlertDelivery], int]:
    stmt = select(AlertDelivery).where(AlertDelivery.alert_id == alert_id)
    return paginate(session, stmt, limit=limit, offset=offset, order_by=AlertDelivery.id)


# --- webhooks and the outbox -----------------------------------------------------------------


def webhooks(session: Session) -> list[Webhook]:
    return list(session.scalars(select(Webhook).order_by(Webhook.id)))


def webhooks_page(session: Session, *, limit: int, offset: int) -> tuple[list[Webhook], int]:
    return paginate(session, select(Webhook), limit=limit, offset=offset, order_by=Webhook.id)


def due_deliveries(session: Session, now: datetime, limit: int) -> list[tuple[int, int]]:
    """(delivery id, webhook id) of due, unclaimed deliveries, oldest first."""
    stmt = (
        select(AlertDelivery.id, AlertDelivery.webhook_id)
        .where(
            AlertDelivery.status == "pending",
            AlertDelivery.next_attempt_at <= now,
            or_(AlertDelivery.lease_expires_at.is_(None), AlertDelivery.lease_expires_at < now),
        )
        .order_by(AlertDelivery.next_attempt_at, AlertDelivery.id)
        .limit(limit)
    )
    return [(row[0], row[1]) for row in session.execute(stmt)]


def defer_delivery(session: Session, delivery_id: int, until: datetime) -> None:
    """Move a pending delivery's next attempt later (rate limit); its attempts are unchanged."""
    session.execute(
        update(AlertDelivery)
        .where(AlertDelivery.id == delivery_id, AlertDelivery.status == "pending", AlertDelivery.next_attempt_at < until)
        .values(next_attempt_at=until)
    )


def claim_delivery(session: Session, delivery_id: int, owner: str, now: datetime, lease_seconds: float) -> bool:
    """Lease one pending, due delivery to ``owner``: a conditional UPDATE that exactly one claimer wins."""
    result = session.execute(
        update(AlertDelivery)
        .where(
            AlertDelivery.id == delivery_id,
            AlertDelivery.status == "pending",
            AlertDelivery.next_attempt_at <= now,
            or_(AlertDelivery.lease_expires_at.is_(None), AlertDelivery.lease_expires_at < now),
        )
        .values(lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_seconds))
        .execution_options(synchronize_session=False)
    )
    return cast(CursorResult, result).rowcount == 1


def finish_delivery(session: Session, delivery_id: int, owner: str, **values: Any) -> bool:
    """Record an attempt's outcome, only while ``owner`` still holds the lease."""
    result = session.execute(
        update(AlertDelivery)
        .where(AlertDelivery.id == delivery_id, AlertDelivery.lease_owner == owner)
        .values(lease_owner=None, lease_expires_at=None, **values)
        .execution_options(synchronize_session=False)
    )
    return cast(CursorResult, result).rowcount == 1


def outbox_counts(session: Session) -> dict[str, int]:
    stmt = select(AlertDelivery.status, func.count()).group_by(AlertDelivery.status)
    return {status: count for status, count in session.execute(stmt)}


# --- evaluations -----------------------------------------------------------------------------


def pending_evaluations(session: Session, limit: int) -> list[tuple[int, datetime]]:
    stmt = (
        select(StudyEvaluation.study_id, StudyEvaluation.requested_at)
        .where(StudyEvaluation.state == "pending")
        .order_by(StudyEvaluation.requested_at)
        .limit(limit)
    )
    return [tuple(row) for row in session.execute(stmt)]  # type: ignore[misc]


def lock_pending_evaluation(session: Session, study_id: int, requested_at: datetime) -> bool:
    """Lock a study's evaluation row while it is still pending for this request (FOR UPDATE on
    PostgreSQL; SQLite serialises writers): True when it is."""
    stmt = (
        select(StudyEvaluation.study_id)
        .where(StudyEvaluation.study_id == study_id, StudyEvaluation.state == "pending",
               StudyEvaluation.requested_at == requested_at)
        .with_for_update()
    )
    return session.scalar(stmt) is not None


def claim_evaluation(session: Session, study_id: int, requested_at: datetime, **values: Any) -> bool:
    """Mark a pending evaluation done, only if nobody else did and it was not re-requested meanwhile."""
    result = session.execute(
        update(StudyEvaluation)
        .where(StudyEvaluation.study_id == study_id, StudyEvaluation.state == "pending",
               StudyEvaluation.requested_at == requested_at)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return cast(CursorResult, result).rowcount == 1


# --- /metrics --------------------------------------------------------------------------------


def latest_evaluations(session: Session, limit: int) -> list[tuple[StudyEvaluation, Study]]:
    stmt = (
        select(StudyEvaluation, Study)
        .join(Study, Study.id == StudyEvaluation.study_id)
        .where(StudyEvaluation.evaluated_at.is_not(None))
        .order_by(StudyEvaluation.study_id.desc())
        .limit(limit)
    )
    return [tuple(row) for row in session.execute(stmt)]  # type: ignore[misc]


def run_counts(session: Session, study_ids: Sequence[int] | None = None) -> list[tuple[int, str, int]]:
    return runs_repo.status_counts(session, study_ids)


def run_status_totals(session: Session) -> dict[str, int]:
    return runs_repo.status_totals(session)


def firing_counts(session: Session) -> list[tuple[str, str, int]]:
    stmt = select(Alert.kind, Alert.severity, func.count()).where(Alert.state == "firing").group_by(
        Alert.kind, Alert.severity
    )
    return [tuple(row) for row in session.execute(stmt)]  # type: ignore[misc]


def worker_counts(session: Session, active_since: datetime) -> tuple[int, int]:
    total = session.scalar(select(func.count()).select_from(Worker)) or 0
    active = session.scalar(select(func.count()).select_from(Worker).where(Worker.last_seen_at >= active_since)) or 0
    return total, active


def recent_studies(session: Session, limit: int) -> list[Study]:
    return list(session.scalars(select(Study).order_by(Study.id.desc()).limit(limit)))
