"""Runs outside the lease protocol's transitions: reading a run, storing metric batches, and
excluding a run from judgement.

The run state machine is split by role: ``leasing`` (queued → running, re-queueing expired
leases), ``transitions`` (heartbeat, complete, fail, release), each a conditional UPDATE in
``repository``.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.auth.service import Caller
from app.config import Settings
from app.db import WriteSession
from app.deps import Principal
from app.errors import Conflict, Invalid, NotFound, TooLarge
from app.metrics import repository as metrics_repo
from app.metrics.encoding import series_arrays
from app.models import Run, utcnow
from app.runs import repository as runs_repo
from app.runs.transitions import verify_lease
from app.studies import service as studies
from worker.protocol import BatchAck, MetricBatch


def get_run(session: Session, run_id: int) -> Run:
    return runs_repo.get_run(session, run_id)


def ingest_batch(
    session: WriteSession, run_id: int, body: MetricBatch, settings: Settings, principal: Principal
) -> BatchAck:
    """Store one metric batch. One query (lease, holder, usage, retry) before the insert; a batch
    re-sent with the same seq is acknowledged as a duplicate and stored once."""
    points = sum(len(s) for s in body.series)
    if points > settings.max_batch_points:
        raise TooLarge(
            f"batch of {points} points is over the limit of {settings.max_batch_points} points (STEADY_MAX_BATCH_POINTS)"
        )
    keys = [s.key for s in body.series]
    ctx = runs_repo.batch_context(session, run_id, body.seq, keys)
    if ctx is None:
        raise NotFound(f"run {run_id} not found")
    verify_lease(ctx.run_id, ctx.status, ctx.lease_id, ctx.lease_expires_at, lambda: ctx.holder_token_id,
                 body.lease_id, principal)
    if ctx.seq_stored:
        return BatchAck(run_id=run_id, seq=body.seq, points=points, duplicate=True)
    _check_run_limits(run_id, ctx.stored_keys + len(keys) - ctx.known_keys, ctx.stored_points + points, settings)
    arrays = [(s.key, *series_arrays(s), s.dtype) for s in body.series]
    stored = metrics_repo.insert_chunks(session, run_id, ctx.attempt, body.seq, arrays)
    return BatchAck(run_id=run_id, seq=body.seq, points=points, duplicate=not stored)


def check_limits(session: Session, run: Run, batch_keys: set[str], points: int, settings: Settings) -> None:
    """Refuse (422) a write that would take the run's current attempt over its key or point limit
    (writes outside the worker's batch path, e.g. the MLflow-compatible endpoint)."""
    keys, stored = metrics_repo.attempt_usage(session, run.id, run.attempt)
    _check_run_limits(run.id, len(keys | batch_keys), stored + points, settings)


def _check_run_limits(run_id: int, keys: int, points: int, settings: Settings) -> None:
    """``keys`` and ``points``: what the run's attempt would hold with the batch."""
    if keys > settings.max_keys_per_run:
        raise Invalid(
            ("body", "series"),
            f"run {run_id} would have {keys} metric keys, over the limit of "
            f"{settings.max_keys_per_run} keys per run (STEADY_MAX_KEYS_PER_RUN)",
        )
    if points > settings.max_points_per_run:
        raise Invalid(
            ("body", "series"),
            f"run {run_id} would hold {points} points, over the limit of "
            f"{settings.max_points_per_run} points per run (STEADY_MAX_POINTS_PER_RUN)",
        )


def exclude_run(session: WriteSession, run_id: int, reason: str, caller: Caller) -> Run:
    """Leave a run out of every judgement (reports, bands, alerts); it stays stored and listed.

    Recorded with who, when and why. Excluding an excluded run updates the reason.
    """
    run = get_run(session, run_id)
    study = studies.get_study(session, run.study_id)
    studies.ensure_study_owner(study, caller)
    run.excluded_at, run.excluded_by, run.excluded_reason = utcnow(), f"{caller.name} (token {caller.token_id})", reason
    study.updated_at = utcnow()
    session.flush()
    return run


def include_run(session: WriteSession, run_id: int, caller: Caller) -> Run:
    """Undo an exclusion: the run is judged again."""
    run = get_run(session, run_id)
    study = studies.get_study(session, run.study_id)
    studies.ensure_study_owner(study, caller)
    if run.excluded_at is None:
        raise Conflict(f"run {run_id} is not excluded")
    run.excluded_at = run.excluded_by = run.excluded_reason = None
    study.updated_at = utcnow()
    session.flush()
    return run
