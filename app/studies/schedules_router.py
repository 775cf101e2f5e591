"""``/api/v1/schedules``: study specs submitted on a schedule (``steady.server.studies.schedules``)."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from steady.server.kit.deps import AppSettings, ReadDB, UserCaller, WriteDB
from steady.server.kit.pagination import Page, PageQuery
from steady.server.studies import schedules
from steady.server.studies.schedules import ScheduleIn, ScheduleOut

router = APIRouter(prefix="/api/v1/schedules", tags=["schedules"])


@router.post("", response_model=ScheduleOut, status_code=status.HTTP_201_CREATED)
def create_schedule(body: ScheduleIn, db: WriteDB, caller: UserCaller, settings: AppSettings) -> ScheduleOut:
    """Keep a study spec to submit on a schedule: ``every`` (e.g. ``6h``; the first fire one interval from
    now) or ``daily`` (``HH:MM`` UTC). Each API process's background loop submits due schedules; one fire
    submits one study, however many processes run. The study is submitted as the schedule's creator."""
    return schedules.schedule_out(schedules.create(db, body, settings, caller))


@router.get("", response_model=Page[ScheduleOut])
def list_schedules(db: ReadDB, caller: UserCaller, page: PageQuery) -> Page[ScheduleOut]:
    rows, total = schedules.page(db, limit=page.limit, offset=page.offset)
    return Page.of([schedules.schedule_out(r) for r in rows], total, page)


@router.delete("/{schedule_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_schedule(schedule_id: int, db: WriteDB, caller: UserCaller) -> Response:
    """Delete a schedule (its creator or an admin); the studies it submitted stay."""
    schedules.delete(db, schedule_id, caller)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
