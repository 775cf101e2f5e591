from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from app.deps import ReadDB, UserCaller, WriteDB
from app.launches import service
from app.launches.schemas import LaunchIn, LaunchOut
from app.studies import service as studies

router = APIRouter(prefix="/api/v1", tags=["launches"])


@router.post("/studies/{study_id}/launches", response_model=LaunchOut, status_code=status.HTTP_201_CREATED)
def record_launch(study_id: int, body: LaunchIn, db: WriteDB, caller: UserCaller) -> LaunchOut:
    """Record a batch job started for a study: its owner's (or an admin's) act, like cancelling it."""
    studies.ensure_study_owner(studies.get_study(db, study_id), caller)
    return LaunchOut.model_validate(service.record(db, study_id, body), from_attributes=True)


@router.get("/studies/{study_id}/launches", response_model=list[LaunchOut])
def study_launches(study_id: int, db: ReadDB, caller: UserCaller) -> list[LaunchOut]:
    studies.get_study(db, study_id)
    return [LaunchOut.model_validate(x, from_attributes=True) for x in service.for_studies(db, [study_id])]


@router.get("/launches", response_model=list[LaunchOut])
def recent_launches(
    db: ReadDB, caller: UserCaller, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> list[LaunchOut]:
    return [LaunchOut.model_validate(x, from_attributes=True) for x in service.for_studies(db, None, limit=limit)]
