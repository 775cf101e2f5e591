"""SQL of the report cache (``study_reports``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import or_, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from steady.server.models import Study, StudyReport
from steady.server.runs import repository as runs_repo
from steady.server.studies import repository as studies_repo
from steady.worker.contract.protocol import StudyStatus

SETTLED_STUDY_STATUSES = tuple(sorted(StudyStatus.TERMINAL))
# The report's JSON format, part of every cached version: a cache written in an older format is
# stale (2: NaN and ±Inf spelled "NaN" / "Infinity" / "-Infinity", steady.server.kit.wire; 1 wrote null / "inf").
REPORT_FORMAT = "f2"


def study_version(session: Session, study: Study) -> str:
    """Names everything a report reads: status, last change, run counts, last finish."""
    p = studies_repo.progress_by_study(session, [study.id])[study.id]
    finished = runs_repo.last_finished_at(session, study.id)
    parts = (REPORT_FORMAT, study.status, study.updated_at.isoformat() if study.updated_at else "", p.total, p.queued, p.running,
             p.completed, p.failed, p.cancelled, finished.isoformat() if finished else "")
    return "|".join(str(x) for x in parts)


def get(session: Session, study_id: int) -> StudyReport | None:
    return session.get(StudyReport, study_id)


def stale_settled_studies(session: Session, limit: int) -> list[int]:
    """Studies that have settled (or take uploads) and changed since their report was cached."""
    stmt = (
        select(Study.id)
        .outerjoin(StudyReport, StudyReport.study_id == Study.id)
        .where(or_(Study.status.in_(SETTLED_STUDY_STATUSES), Study.kind == "external"))
        .where(or_(StudyReport.study_id.is_(None), StudyReport.computed_at < Study.updated_at,
                   ~StudyReport.version.startswith(REPORT_FORMAT + "|", autoescape=True)))
        .order_by(Study.updated_at)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def try_lock(session: Session, study_id: int) -> bool:
    """On PostgreSQL, one API process computes a study's report at a time (transaction lock)."""
    if session.get_bind().dialect.name != "postgresql":
        return True
    return bool(session.scalar(text("SELECT pg_try_advisory_xact_lock(5731, :id)"), {"id": study_id}))


def put(session: Session, study_id: int, *, version: str, body: bytes | None, computed_at: datetime,
        compute_seconds: float) -> None:
    values = {"study_id": study_id, "version": version, "body": body, "computed_at": computed_at,
              "compute_seconds": compute_seconds}
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    stmt = insert(StudyReport).values(**values)
    session.execute(stmt.on_conflict_do_update(index_elements=[StudyReport.study_id],
                                               set_={k: v for k, v in values.items() if k != "study_id"}))
