from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from steady.server.models import Launch
from steady.server.kit.repository import paginate


def add(session: Session, launch: Launch) -> Launch:
    session.add(launch)
    session.flush()
    return launch


def list_launches(
    session: Session, *, study_ids: Sequence[int] | None, limit: int, offset: int = 0
) -> tuple[list[Launch], int]:
    """Launches of the given studies (of all with None), newest first."""
    stmt = select(Launch)
    if study_ids is not None:
        stmt = stmt.where(Launch.study_id.in_(list(study_ids)))
    return paginate(session, stmt, limit=limit, offset=offset, order_by=Launch.id.desc())
