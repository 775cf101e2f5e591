"""What every domain's repository does the same way: fetch one row or answer 404, and count and
page a filtered query."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from steady.server.kit.errors import NotFound

M = TypeVar("M")


def get_or_404(session: Session, model: type[M], ident: Any, noun: str | None = None) -> M:
    """The row with primary key ``ident``, or :class:`NotFound` naming it ("alert rule 7 not found")."""
    row = session.get(model, ident)
    if row is None:
        raise NotFound(f"{noun or model.__name__.lower()} {ident} not found")
    return row


def paginate(session: Session, stmt: Select[Any], *, limit: int, offset: int, order_by: Any) -> tuple[list[Any], int]:
    """One page of ``stmt`` (already filtered) in ``order_by`` order, and how many rows match in all."""
    total = session.scalar(select(func.count()).select_from(stmt.order_by(None).subquery())) or 0
    rows = session.scalars(stmt.order_by(*_as_tuple(order_by)).limit(limit).offset(offset))
    return list(rows), total


def _as_tuple(order_by: Any) -> tuple[Any, ...]:
    return tuple(order_by) if isinstance(order_by, (list, tuple)) else (order_by,)
