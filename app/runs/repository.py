"""SQL of the run state machine that is worth keeping apart: what a metric batch needs, in one query."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, bindparam, distinct, exists, func, select
from sqlalchemy.orm import Session

from app.models import MetricChunk, Run, Worker


@dataclass(frozen=True)
class BatchContext:
    """A run's lease state and its current attempt's usage, as one metric batch needs them."""

    run_id: int
    status: str
    lease_id: str | None
    lease_expires_at: datetime | None
    attempt: int
    holder_token_id: int | None  # the token of the worker the run is leased to
    stored_points: int  # points stored for the current attempt
    stored_keys: int  # distinct keys stored for the current attempt
    known_keys: int  # how many of the batch's keys are among them
    seq_stored: bool  # this batch seq is already stored for the current attempt (a retry)


def _batch_context_statement():  # noqa: ANN202
    chunks, runs, workers = MetricChunk.__table__, Run.__table__, Worker.__table__
    current = and_(chunks.c.run_id == runs.c.id, chunks.c.attempt == runs.c.attempt)
    return (
        select(
            runs.c.id,
            runs.c.status,
            runs.c.lease_id,
            runs.c.lease_expires_at,
            runs.c.attempt,
            workers.c.token_id,
            select(func.coalesce(func.sum(chunks.c.n), 0)).where(current).scalar_subquery(),
            select(func.count(distinct(chunks.c.key))).where(current).scalar_subquery(),
            select(func.count(distinct(chunks.c.key)))
            .where(current, chunks.c.key.in_(bindparam("keys", expanding=True)))
            .scalar_subquery(),
            exists().where(current, chunks.c.seq == bindparam("seq")),
        )
        .select_from(runs.outerjoin(workers, workers.c.id == runs.c.worker_id))
        .where(runs.c.id == bindparam("run_id"))
    )


# Built once: the hot path of ingestion then skips building the statement and its cache key.
_BATCH_CONTEXT = _batch_context_statement()


def batch_context(session: Session, run_id: int, seq: int, keys: Collection[str]) -> BatchContext | None:
    """Everything ``ingest_batch`` checks before it inserts, in one round trip (None: no such run)."""
    row = session.connection().execute(_BATCH_CONTEXT, {"run_id": run_id, "seq": seq, "keys": list(keys)}).first()
    if row is None:
        return None
    return BatchContext(
        run_id=row[0], status=row[1], lease_id=row[2], lease_expires_at=row[3], attempt=row[4],
        holder_token_id=row[5], stored_points=int(row[6] or 0), stored_keys=int(row[7] or 0),
        known_keys=int(row[8] or 0), seq_stored=bool(row[9]),
    )
