"""Studies submitted on a schedule: a spec kept in the database with ``every`` (an interval) or ``daily``
(a UTC time of day), submitted by the API processes' background loop when due.

Stored, not held in memory, so a schedule survives a restart. Firing is a checked transition: the
process whose conditional UPDATE moves ``next_due_at`` from the value it read wins the schedule and
submits the study in the same transaction, so a due schedule fires once however many API processes
look at it (a second claimer's UPDATE matches no row: on PostgreSQL it waits for the first one's
row lock, then sees the moved ``next_due_at``). Fires missed while no server ran are not caught up
one by one: the schedule fires once and its next time is the first one after now.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime, time, timedelta
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from steady.server.kit.auth import Caller, Role
from steady.server.kit.background import BackgroundLoop
from steady.server.kit.config import Settings
from steady.server.kit.db import Database
from steady.server.kit.errors import Conflict, Invalid, NotFound
from steady.server.kit.repository import paginate
from steady.server.models import ApiToken, StudySchedule, utcnow
from steady.server.studies.alert_specs import Name
from steady.server.studies.schemas import StudySpec

log = logging.getLogger("steady.schedules")

MIN_EVERY_SECONDS = 60
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_EVERY = re.compile(r"^\s*(\d{1,7})\s*([smhd])\s*$")
_DAILY = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")


def parse_every(text: str) -> int:
    """``"6h"`` → 21600; a number with one unit of s, m, h, d; at least a minute."""
    m = _EVERY.match(text)
    if not m:
        raise ValueError(f"{text!r} is not an interval: write a whole number and a unit s, m, h or d (e.g. 6h)")
    seconds = int(m.group(1)) * _UNITS[m.group(2)]
    if seconds < MIN_EVERY_SECONDS:
        raise ValueError(f"{text!r} is shorter than the shortest interval, {MIN_EVERY_SECONDS} s")
    return seconds


def next_daily(daily_at: str, after: datetime) -> datetime:
    """The first ``HH:MM`` (UTC) strictly after ``after``."""
    hour, minute = (int(x) for x in daily_at.split(":"))
    at = datetime.combine(after.date(), time(hour, minute), tzinfo=after.tzinfo)
    return at if at > after else at + timedelta(days=1)


def next_due(schedule: StudySchedule, now: datetime) -> datetime:
    """The schedule's next time after ``now``: an interval counts on from its last due time (so a busy
    loop does not drift), and skips the times missed while no server ran."""
    if schedule.daily_at is not None:
        return next_daily(schedule.daily_at, now)
    every = timedelta(seconds=int(schedule.every_seconds or MIN_EVERY_SECONDS))
    due = schedule.next_due_at
    missed = max(0, int((now - due) // every))
    nxt = due + every * (missed + 1)
    return nxt if nxt > now else nxt + every


class ScheduleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name = Field(description="the schedule's name, unique")
    spec: StudySpec = Field(description="the study spec submitted at every fire (as POST /api/v1/studies takes it)")
    every: Annotated[str, Field(max_length=20)] | None = Field(
        None, description="an interval: a whole number and a unit s, m, h or d (e.g. 6h); at least 60 s")
    daily: Annotated[str, Field(max_length=5)] | None = Field(None, description="a time of day, HH:MM in UTC")

    @field_validator("every")
    @classmethod
    def _every(cls, value: str | None) -> str | None:
        if value is not None:
            parse_every(value)
        return value

    @field_validator("daily")
    @classmethod
    def _daily(cls, value: str | None) -> str | None:
        if value is not None and not _DAILY.match(value):
            raise ValueError(f"{value!r} is not a time of day: write HH:MM (UTC), e.g. 02:30")
        return value

    @model_validator(mode="after")
    def _one_of(self) -> ScheduleIn:
        if (self.every is None) == (self.daily is None):
            raise ValueError("give exactly one of 'every' (an interval) and 'daily' (HH:MM UTC)")
        return self


class ScheduleOut(BaseModel):
    id: int
    name: str
    every_seconds: int | None
    daily_at: str | None = Field(description="HH:MM UTC")
    next_due_at: datetime
    last_fired_at: datetime | None
    last_study_id: int | None = Field(description="the study the last fire submitted")
    last_error: str | None = Field(description="why the last fire submitted no study, if it did not")
    fired_count: int
    owner_token_id: int | None
    created_at: datetime
    spec: dict[str, Any]


def schedule_out(row: StudySchedule) -> ScheduleOut:
    return ScheduleOut.model_validate(row, from_attributes=True)


def create(session: Session, body: ScheduleIn, settings: Settings, caller: Caller) -> StudySchedule:
    spec = body.spec
    if spec.kind != "managed":
        raise Invalid(("body", "spec", "kind"), "an external study has no runs to submit: schedule a managed one")
    if session.scalars(select(StudySchedule.id).where(StudySchedule.name == body.name)).first() is not None:
        raise Invalid(("body", "name"), f"a schedule named {body.name!r} exists already")
    from steady.server.studies import service as studies  # the spec is checked now as a submit would

    studies.check_code(session, spec)
    if spec.suite:  # as a submit would: a schedule may not add studies to another user's suite
        studies.ensure_suite_owner(session, spec.suite, caller)
    now = utcnow()
    row = StudySchedule(name=body.name, spec=spec.model_dump(mode="json"), owner_token_id=caller.token_id,
                        every_seconds=parse_every(body.every) if body.every else None, daily_at=body.daily,
                        fired_count=0, created_at=now)
    row.next_due_at = next_daily(body.daily, now) if body.daily else now + timedelta(seconds=row.every_seconds or 0)
    session.add(row)
    session.flush()
    return row


def page(session: Session, *, limit: int, offset: int) -> tuple[list[StudySchedule], int]:
    return paginate(session, select(StudySchedule), limit=limit, offset=offset, order_by=StudySchedule.id)


def delete(session: Session, schedule_id: int, caller: Caller) -> None:
    row = session.get(StudySchedule, schedule_id)
    if row is None:
        raise NotFound(f"schedule {schedule_id} not found")
    if caller.role is not Role.admin and row.owner_token_id != caller.token_id:
        from steady.server.kit.errors import Forbidden

        raise Forbidden(f"schedule {schedule_id} is another user's: only they or an admin may delete it")
    session.delete(row)
    session.flush()


# --- firing --------------------------------------------------------------------------------------


def due(session: Session, now: datetime, limit: int = 50) -> list[tuple[int, datetime]]:
    """(id, next_due_at) of the schedules due at ``now``, read without locks."""
    stmt = (select(StudySchedule.id, StudySchedule.next_due_at).where(StudySchedule.next_due_at <= now)
            .order_by(StudySchedule.next_due_at, StudySchedule.id).limit(limit))
    return [(int(i), d) for i, d in session.execute(stmt).all()]


def claim(session: Session, schedule_id: int, seen_due: datetime, now: datetime) -> StudySchedule | None:
    """``due → fired``: moves ``next_due_at`` on from the value read; the schedule for exactly one caller."""
    row = session.get(StudySchedule, schedule_id, populate_existing=True)
    if row is None or row.next_due_at != seen_due:
        return None
    result = session.execute(
        update(StudySchedule)
        .where(StudySchedule.id == schedule_id, StudySchedule.next_due_at == seen_due)
        .values(next_due_at=next_due(row, now), last_fired_at=now, fired_count=StudySchedule.fired_count + 1)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return None
    return session.get(StudySchedule, schedule_id, populate_existing=True)


class _Owner:
    """The schedule's owner as the caller of the study it submits."""

    def __init__(self, token: ApiToken) -> None:
        self.token_id, self.name, self.role = token.id, token.name, Role(token.role)


def fire(database: Database, settings: Settings, schedule_id: int, seen_due: datetime) -> int | None:
    """Claim one due schedule and submit its study, in one transaction; the study's id, or None when
    another process fired it (or it could not be submitted: ``last_error`` says why)."""
    from steady.server.studies import service as studies

    with database.write() as session:
        now = utcnow()
        row = claim(session, schedule_id, seen_due, now)
        if row is None:
            return None
        token = session.get(ApiToken, row.owner_token_id) if row.owner_token_id is not None else None
        if token is None or token.revoked_at is not None:
            row.last_study_id, row.last_error = None, "its owner's token was revoked or deleted: no study submitted"
            return None
        try:
            with session.begin_nested():
                study = studies.create_study(session, StudySpec.model_validate(row.spec), settings, _Owner(token))
        except (Invalid, Conflict, NotFound, ValidationError) as exc:
            row.last_study_id, row.last_error = None, f"not submitted: {exc}"[:2000]
            log.warning("schedule %s (%s): %s", row.id, row.name, row.last_error)
            return None
        row.last_study_id, row.last_error = study.id, None
        session.flush()
        log.info("schedule %s (%s) submitted study %s", row.id, row.name, study.id)
        return study.id


def fire_due(database: Database, settings: Settings) -> list[int]:
    """Submit every due schedule's study (the loop's tick); the ids of the studies this process submitted."""
    with database.read() as session:
        pending = due(session, utcnow())
    submitted = []
    for schedule_id, seen_due in pending:
        study_id = fire(database, settings, schedule_id, seen_due)
        if study_id is not None:
            submitted.append(study_id)
    return submitted


def scheduler(database: Database, settings: Settings) -> BackgroundLoop:
    """The schedules' loop: every API process runs one, like the lease reaper; a schedule fires once."""
    return BackgroundLoop("study scheduler", lambda: fire_due(database, settings),
                          interval=settings.schedule_interval_seconds)
