from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.models import Run, Study, StudyStage
from app.repository import paginate
from app.studies.schemas import Progress


def progress_by_study(session: Session, study_ids: Sequence[int]) -> dict[int, Progress]:
    out = {sid: Progress() for sid in study_ids}
    if not study_ids:
        return out
    stmt = (
        select(Run.study_id, Run.status, func.count())
        .where(Run.study_id.in_(list(study_ids)))
        .group_by(Run.study_id, Run.status)
    )
    for study_id, status, count in session.execute(stmt):
        p = out[study_id]
        setattr(p, status, getattr(p, status) + count)
        p.total += count
    return out


def list_studies(
    session: Session, *, status: str | None, suite: str | None, name: str | None, limit: int, offset: int
) -> tuple[list[Study], int]:
    stmt = select(Study)
    if status:
        stmt = stmt.where(Study.status == status)
    if suite:
        stmt = stmt.where(Study.suite == suite)
    if name:
        stmt = stmt.where(Study.name.contains(name, autoescape=True))
    return paginate(session, stmt, limit=limit, offset=offset, order_by=Study.id.desc())


def list_runs(
    session: Session, study_id: int, *, status: str | None, limit: int, offset: int
) -> tuple[list[Run], int]:
    stmt = select(Run).where(Run.study_id == study_id)
    if status:
        stmt = stmt.where(Run.status == status)
    return paginate(session, stmt, limit=limit, offset=offset, order_by=Run.id)


def first_study_of_suite(session: Session, suite: str) -> Study | None:
    return session.scalars(select(Study).where(Study.suite == suite).order_by(Study.id).limit(1)).first()


def first_failed_run(session: Session, study_id: int) -> Run | None:
    stmt = select(Run).where(Run.study_id == study_id, Run.status == "failed").order_by(Run.finished_at, Run.id).limit(1)
    return session.scalars(stmt).first()


def stages_of(session: Session, study_id: int) -> list[StudyStage]:
    return list(session.scalars(select(StudyStage).where(StudyStage.study_id == study_id).order_by(StudyStage.stage)))


def current_stages(session: Session, study_ids: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Per adaptive study: (its latest stage, the seeds of all its stages)."""
    if not study_ids:
        return {}
    out: dict[int, tuple[int, int]] = {}
    rows = session.execute(select(StudyStage.study_id, StudyStage.stage, StudyStage.seeds)
                           .where(StudyStage.study_id.in_(list(study_ids))).order_by(StudyStage.stage))
    for study_id, stage, seeds in rows:
        _, n = out.get(study_id, (0, 0))
        out[study_id] = (stage, n + len(seeds or []))
    return out


def add_stage(session: Session, study_id: int, stage: int, seeds: list[int]) -> StudyStage:
    row = StudyStage(study_id=study_id, stage=stage, seeds=list(seeds), decisions=[])
    session.add(row)
    session.flush()
    return row
