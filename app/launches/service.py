"""Launches: a record of the batch jobs that started agents for a study.

For people only (``steady status``, the study page): which run went where is decided by the
leases, never by this table.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from steady.server.launches import repository
from steady.server.launches.schemas import LaunchIn
from steady.server.models import Launch
from steady.server.studies import service as studies


def record(session: Session, study_id: int, body: LaunchIn) -> Launch:
    studies.get_study(session, study_id)
    return repository.add(session, Launch(study_id=study_id, engine=body.engine, job_id=body.job_id,
                                          tasks=body.tasks, detail=body.detail))


def for_studies(
    session: Session, study_ids: Sequence[int] | None, *, limit: int = 100, offset: int = 0
) -> tuple[list[Launch], int]:
    return repository.list_launches(session, study_ids=study_ids, limit=limit, offset=offset)
