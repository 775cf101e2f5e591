from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import Launch


def add(session: Session, launch: Launch) -> Launch:
    session.add(launch)
    session.flush()
    return launch


def list_launches(session: Session, *, study_ids: Sequence[int] | None, limit: int) -> list[Launch]:
    stmt = select(Launch).order_by(Launch.id.desc()).limit(limit)
    if study_ids is not None:
        stmt = stmt.where(Launch.study_id.in_(list(study_ids)))
    return list(session.scalars(stmt))
