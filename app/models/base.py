from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import ClassVar

from sqlalchemy import DateTime, MetaData, Table
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Clock:
    """The server's notion of now: the wall clock plus an offset that only tests set.

    Every lease expiry, session expiry and alert back-off compares against ``utcnow()``, so a
    test moves time forward (``clock.advance(seconds)``) instead of sleeping past a deadline.
    """

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)

    def reset(self) -> None:
        self.offset = timedelta(0)


clock = Clock()


def utcnow() -> datetime:
    return clock.now()


class UTCDateTime(TypeDecorator):
    """Stored as naive UTC on every backend, returned timezone-aware."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTCDateTime column")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    __table__: ClassVar[Table]  # every model maps one table (SQLAlchemy types it as any FromClause)
