from __future__ import annotations

from fastapi import APIRouter, status

from steady.server.kit.deps import ReadDB, UserCaller, WriteDB
from steady.server.launches import service
from steady.server.launches.schemas import LaunchIn, LaunchOut
from steady.server.models import Launch
from steady.server.kit.pagination import Page, PageParams, PageQuery
from steady.server.studies import service as studies

router = APIRouter(prefix="/api/v1", tags=["launches"])


@router.post("/studies/{study_id}/launches", response_model=LaunchOut, status_code=status.HTTP_201_CREATED)
def record_launch(study_id: int, body: LaunchIn, db: WriteDB, caller: UserCaller) -> LaunchOut:
    """Record a batch job started for a study: its owner's (or an admin's) act, like cancelling it."""
    studies.ensure_study_owner(studies.get_study(db, study_id), caller)
    return LaunchOut.model_validate(service.record(db, study_id, body), from_attributes=True)


@router.get("/studies/{study_id}/launches/permission", status_code=status.HTTP_204_NO_CONTENT,
            responses={403: {"description": "the caller may not launch agents for this study"}})
def launch_permission(study_id: int, db: ReadDB, caller: UserCaller) -> None:
    """May the caller launch agents for this study (its owner or an admin)? ``steady launch`` asks before it
    calls ``sbatch`` or the Kubernetes API, so a refused launch starts no job: 204 yes, 403 no, 404 no such study."""
    studies.ensure_study_owner(studies.get_study(db, study_id), caller)


@router.get("/studies/{study_id}/launches", response_model=Page[LaunchOut])
def study_launches(study_id: int, db: ReadDB, caller: UserCaller, page: PageQuery) -> Page[LaunchOut]:
    studies.get_study(db, study_id)
    return _page(*service.for_studies(db, [study_id], limit=page.limit, offset=page.offset), page)


@router.get("/launches", response_model=Page[LaunchOut])
def recent_launches(db: ReadDB, caller: UserCaller, page: PageQuery) -> Page[LaunchOut]:
    """Launches of every study, newest first."""
    return _page(*service.for_studies(db, None, limit=page.limit, offset=page.offset), page)


def _page(rows: list[Launch], total: int, page: PageParams) -> Page[LaunchOut]:
    return Page.of([LaunchOut.model_validate(x, from_attributes=True) for x in rows], total, page)
