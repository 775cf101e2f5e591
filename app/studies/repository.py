from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from steady.server.kit.db import WriteSession
from steady.server.kit.errors import NotFound
from steady.server.models import Run, Study, StudyEvaluation, StudyStage, utcnow
from steady.server.runs import repository as runs_repo
from steady.server.kit.repository import paginate
from steady.server.studies.schemas import Progress


def get_study(session: Session, study_id: int, *, lock: bool = False) -> Study:
    """The study; ``lock``: its row FOR UPDATE (re-read, not the session's copy) until the transaction ends, so
    writes that read the study's state first run one after another (on SQLite writes are serial already)."""
    if lock:
        locked = select(Study).where(Study.id == study_id).with_for_update().execution_options(populate_existing=True)
        study = session.scalars(locked).first()
    else:
        study = session.get(Study, study_id)
    if study is None:
        raise NotFound(f"study {study_id} not found")
    return study


def request_evaluation(session: Session, study_id: int) -> None:
    """Record that a study finished and awaits its alert evaluation (a pending ``study_evaluations``
    row; the alert dispatcher picks it up). A re-request resets the row to pending."""
    row = session.get(StudyEvaluation, study_id)
    if row is None:
        session.add(StudyEvaluation(study_id=study_id, state="pending", requested_at=utcnow(), summary={}))
    else:
        row.state, row.requested_at, row.error = "pending", utcnow(), None
    session.flush()


def progress_by_study(session: Session, study_ids: Sequence[int]) -> dict[int, Progress]:
    out = {sid: Progress() for sid in study_ids}
    for study_id, status, count in runs_repo.status_counts(session, study_ids):
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


def first_study_of_suite(session: Session, suite: str) -> Study | None:
    return session.scalars(select(Study).where(Study.suite == suite).order_by(Study.id).limit(1)).first()


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


def runs_of_seeds(session: Session, study_id: int, seeds: Sequence[int]) -> int:
    """How many runs the study has for these seeds (one stage's runs, every attempt counted once)."""
    if not seeds:
        return 0
    return int(session.scalar(select(func.count()).select_from(Run)
                              .where(Run.study_id == study_id, Run.seed.in_(list(seeds)))) or 0)


def add_stage(session: WriteSession, study_id: int, stage: int, seeds: list[int]) -> StudyStage:
    row = StudyStage(study_id=study_id, stage=stage, seeds=list(seeds), decisions=[])
    session.add(row)
    session.flush()
    return row
