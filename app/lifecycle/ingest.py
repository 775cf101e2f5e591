"""A worker's metric batch, in two halves: ``prepare`` (no database: size limit, decoding, the
chunk rows) and ``store`` (one query for lease, holder, usage and retry, then the insert).

The ingestion route prepares in the request and stores through the process's group committer
(``steady.server.lifecycle.committer``), so the database half of many requests shares one commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from sqlalchemy.exc import IntegrityError

from steady.server.kit.config import Settings
from steady.server.kit.db import WriteSession
from steady.server.kit.deps import Principal
from steady.server.kit.errors import NotFound, TooLarge
from steady.server.metrics import repository as metrics_repo
from steady.server.metrics.encoding import series_arrays
from steady.server.runs import repository as runs_repo
from steady.server.lifecycle.committer import GroupCommitter
from steady.server.lifecycle.service import check_run_limits
from steady.server.lifecycle.transitions import verify_lease
from steady.worker.contract.protocol import BatchAck, MetricBatch


@dataclass(frozen=True)
class PreparedBatch:
    """A metric batch checked on its face and encoded into chunk rows, ready to store."""

    run_id: int
    lease_id: str
    seq: int
    keys: tuple[str, ...]
    points: int
    rows: list[dict]


def prepare(run_id: int, body: MetricBatch, settings: Settings) -> PreparedBatch:
    """Refuse a batch over the size limit (413); decode and encode the rest. No database."""
    points = sum(len(s) for s in body.series)
    if points > settings.max_batch_points:
        raise TooLarge(
            f"batch of {points} points is over the limit of {settings.max_batch_points} points (STEADY_MAX_BATCH_POINTS)"
        )
    rows = []
    for s in body.series:
        if s.steps_b64 is not None:  # packed: rows made from the decoded bytes as they are
            row = metrics_repo.packed_chunk_row(s.key, *s.packed_bytes(), s.dtype, s.resolution)
            rows.extend([row] if row is not None else [])
        else:
            rows.extend(metrics_repo.chunk_rows([(s.key, *series_arrays(s), s.dtype, s.resolution)]))
    return PreparedBatch(run_id=run_id, lease_id=body.lease_id, seq=body.seq, keys=tuple(s.key for s in body.series),
                         points=points, rows=rows)


def store(session: WriteSession, batch: PreparedBatch, settings: Settings, principal: Principal) -> BatchAck:
    """Store a prepared batch, in a savepoint of its own (the group committer gives it one). One
    query (lease, holder, usage, retry) before the insert; a batch re-sent with the same seq is
    acknowledged as a duplicate and stored once."""
    run_id = batch.run_id
    ctx = runs_repo.batch_context(session, run_id, batch.seq, batch.keys)
    if ctx is None:
        raise NotFound(f"run {run_id} not found")
    verify_lease(ctx.run_id, ctx.status, ctx.lease_id, ctx.lease_expires_at, lambda: ctx.holder_token_id,
                 batch.lease_id, principal)
    if ctx.seq_stored:
        return BatchAck(run_id=run_id, seq=batch.seq, points=batch.points, duplicate=True)
    check_run_limits(run_id, ctx.stored_keys + len(batch.keys) - ctx.known_keys, ctx.stored_points + batch.points,
                     settings)
    metrics_repo.insert_rows(session, run_id, ctx.attempt, batch.seq, batch.rows, savepoint=False, known=ctx.known)
    return BatchAck(run_id=run_id, seq=batch.seq, points=batch.points, duplicate=False)


async def submit(committer: GroupCommitter, batch: PreparedBatch, settings: Settings, principal: Principal) -> BatchAck:
    """Store through the process's group committer; answered after the commit. The same batch
    stored by another API process between the check and the insert (PostgreSQL, a retry racing
    its original) fails this insert: tried again, it is answered as a duplicate."""
    work = partial(store, batch=batch, settings=settings, principal=principal)
    try:
        return await committer.run(work, order=batch.run_id)
    except IntegrityError:
        return await committer.run(work, order=batch.run_id)
