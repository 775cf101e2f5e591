"""The run state machine: lease, heartbeat, metrics, complete, fail, release, reap.

Every transition is a conditional UPDATE on the run's current state, so it succeeds for
exactly one caller however many API processes and workers race for it.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from sqlalchemy import and_, select, update
from sqlalchemy.orm import Session

from app.config import Settings
from app.errors import Conflict, NotFound, TooLarge
from app.metrics import repository as metrics_repo
from app.metrics.encoding import json_float, series_arrays
from app.models import Run, Study, Worker, utcnow
from app.studies import service as studies
from worker.protocol import (
    BatchAck,
    Heartbeat,
    HeartbeatAck,
    Lease,
    MetricBatch,
    RunAck,
    RunFailure,
    RunRelease,
    RunResult,
    RunSpec,
    RunStatus,
)

CANDIDATES_PER_LEASE = 200


def _spec_for(run: Run, study: Study) -> RunSpec:
    spec = study.spec
    workload = spec["workload"]
    return RunSpec(
        framework=run.framework,
        workload=workload.get("name"),
        entrypoint=workload.get("entrypoint"),
        params=workload.get("params", {}),
        seed=run.seed,
        repeat=run.repeat,
        determinism=run.determinism,
        threads=spec.get("threads", 2),
        time_limit_s=spec.get("time_limit_s", 1800.0),
        metrics=[m["name"] for m in spec.get("metrics", [])],
        stack=run.stack,
    )


def reap_expired(session: Session, now: datetime | None = None) -> list[int]:
    """Re-queue runs whose lease expired, or fail them once their attempts are spent.

    Safe to run in every API process at once: each UPDATE only matches runs still expired.
    """
    now = now or utcnow()
    expired = and_(Run.status == RunStatus.running.value, Run.lease_expires_at < now)
    study_ids = set(session.scalars(select(Run.study_id).where(expired)))
    if not study_ids:
        return []
    session.execute(
        update(Run)
        .where(expired, Run.attempt < Run.max_attempts, Run.cancel_requested.is_(False))
        .values(status=RunStatus.queued.value, lease_id=None, lease_expires_at=None, worker_id=None)
    )
    session.execute(
        update(Run)
        .where(expired, Run.cancel_requested.is_(True))
        .values(status=RunStatus.cancelled.value, lease_id=None, finished_at=now, error="study cancelled")
    )
    session.execute(
        update(Run)
        .where(expired)
        .values(
            status=RunStatus.failed.value,
            lease_id=None,
            finished_at=now,
            failure_kind="lost",
            error="lease expired on the last allowed attempt: the worker stopped heartbeating",
        )
    )
    for study_id in sorted(study_ids):
        studies.refresh_status(session, study_id)
    return sorted(study_ids)


def _own_blocks_first(session: Session, worker_id: int, candidates: list) -> list:
    """Queued candidates in lease preference order: runs of a block this worker already ran part
    of, then blocks no worker has started, then blocks another worker started; id order within each.

    A block is (study, seed, repeat, stack): one run per determinism level, created next to each
    other (``studies.service.create_study``). Kept on one worker and run one after the other,
    its runs can be compared paired for the cost of determinism (``app.stats.cost``). A
    preference only: a worker still takes another worker's block when nothing else is queued.
    """
    if not candidates:
        return candidates
    blocks = {(c.study_id, c.seed, c.repeat, c.stack) for c in candidates}
    started = session.execute(
        select(Run.study_id, Run.seed, Run.repeat, Run.stack, Run.worker_id).where(
            Run.study_id.in_({b[0] for b in blocks}),
            Run.seed.in_({b[1] for b in blocks}),
            Run.status != RunStatus.queued.value,
            Run.worker_id.is_not(None),
        )
    ).all()
    workers: dict[tuple, set[int]] = {}
    for study_id, seed, repeat, stack, wid in started:
        if (study_id, seed, repeat, stack) in blocks:
            workers.setdefault((study_id, seed, repeat, stack), set()).add(wid)

    def rank(c) -> tuple[int, int]:  # noqa: ANN001
        owners = workers.get((c.study_id, c.seed, c.repeat, c.stack), set())
        return (0 if worker_id in owners else 1 if not owners else 2, c.id)

    return sorted(candidates, key=rank)


def lease_next(session: Session, worker: Worker, settings: Settings) -> Lease | None:
    now = utcnow()
    reap_expired(session, now)
    worker.last_seen_at = now
    labels = set(worker.labels)
    # Candidates are read without locks: locking them all (FOR UPDATE SKIP LOCKED on the whole
    # page) made concurrent leasers on PostgreSQL skip every queued run and answer 204. Each
    # matching candidate is then locked alone, skipping one another leaser holds right now.
    stmt = (
        select(Run.id, Run.required_labels, Run.study_id, Run.seed, Run.repeat, Run.stack)
        .where(Run.status == RunStatus.queued.value)
        .order_by(Run.id)
        .limit(CANDIDATES_PER_LEASE)
    )
    for run_id, required, *_ in _own_blocks_first(session, worker.id, session.execute(stmt).all()):
        if not set(required) <= labels:
            continue
        claimable = (
            select(Run.id)
            .where(Run.id == run_id, Run.status == RunStatus.queued.value)
            .with_for_update(skip_locked=True)
        )
        if session.execute(claimable).first() is None:
            continue
        lease_id = uuid.uuid4().hex
        expires = now + timedelta(seconds=settings.lease_seconds)
        result = session.execute(
            update(Run)
            .where(Run.id == run_id, Run.status == RunStatus.queued.value)
            .values(
                status=RunStatus.running.value,
                attempt=Run.attempt + 1,
                lease_id=lease_id,
                lease_expires_at=expires,
                worker_id=worker.id,
                started_at=now,
                progress_step=None,
            )
        )
        if result.rowcount != 1:
            continue
        run = session.get(Run, run_id, populate_existing=True)
        assert run is not None
        metrics_repo.delete_other_attempts(session, run.id, run.attempt)
        study = session.get(Study, run.study_id)
        assert study is not None
        if study.status != "running":  # a lease only ever moves a study from queued to running
            studies.refresh_status(session, study.id)
        return Lease(
            run_id=run.id,
            study_id=run.study_id,
            attempt=run.attempt,
            lease_id=lease_id,
            lease_expires_at=expires,
            heartbeat_seconds=settings.heartbeat_seconds,
            spec=_spec_for(run, study),
        )
    return None


def _leased_run(session: Session, run_id: int, lease_id: str, *, lock: bool = True) -> Run:
    stmt = select(Run).where(Run.id == run_id)
    if lock:
        stmt = stmt.with_for_update()
    run = session.scalars(stmt).first()
    if run is None:
        raise NotFound(f"run {run_id} not found")
    if run.lease_id != lease_id:
        raise Conflict(f"lease lost: run {run_id} is no longer leased under this lease (it was re-queued or taken over)")
    if run.status != RunStatus.running.value:
        raise Conflict(f"run {run_id} is {run.status}, not running")
    if run.lease_expires_at is not None and run.lease_expires_at < utcnow():
        raise Conflict(f"lease lost: the lease of run {run_id} expired at {run.lease_expires_at.isoformat()}")
    return run


def heartbeat(session: Session, run_id: int, body: Heartbeat, settings: Settings) -> HeartbeatAck:
    run = _leased_run(session, run_id, body.lease_id)
    now = utcnow()
    run.lease_expires_at = now + timedelta(seconds=settings.lease_seconds)
    if body.step is not None:
        run.progress_step = body.step
    if run.worker_id is not None:
        session.execute(update(Worker).where(Worker.id == run.worker_id).values(last_seen_at=now))
    session.flush()
    return HeartbeatAck(lease_expires_at=run.lease_expires_at, cancel=run.cancel_requested)


def ingest_batch(session: Session, run_id: int, body: MetricBatch, settings: Settings) -> BatchAck:
    points = sum(len(s) for s in body.series)
    if points > settings.max_batch_points:
        raise TooLarge(
            f"batch of {points} points is over the limit of {settings.max_batch_points} points (STEADY_MAX_BATCH_POINTS)"
        )
    run = _leased_run(session, run_id, body.lease_id, lock=False)
    if metrics_repo.batch_exists(session, run.id, run.attempt, body.seq):
        return BatchAck(run_id=run.id, seq=body.seq, points=points, duplicate=True)
    arrays = [(s.key, *series_arrays(s), s.dtype) for s in body.series]
    stored = metrics_repo.insert_chunks(session, run.id, run.attempt, body.seq, arrays)
    return BatchAck(run_id=run.id, seq=body.seq, points=points, duplicate=not stored)


def complete(session: Session, run_id: int, body: RunResult) -> RunAck:
    run = _finished_guard(session, run_id, body.lease_id)
    now = utcnow()
    run.status = RunStatus.completed.value
    run.final_metrics = {k: json_float(v) for k, v in body.final_metrics.items()}
    run.digests = body.digests.model_dump(mode="json")
    run.fingerprint = body.fingerprint
    run.determinism_applied = body.determinism_applied
    run.timings = {k: json_float(v) for k, v in body.timings.items()}
    run.finished_at = now
    run.lease_expires_at = None
    metrics_repo.delete_other_attempts(session, run.id, run.attempt)
    session.flush()
    studies.refresh_status(session, run.study_id)
    return RunAck(run_id=run.id, status=RunStatus.completed)


def fail(session: Session, run_id: int, body: RunFailure) -> RunAck:
    run = _finished_guard(session, run_id, body.lease_id)
    status = RunStatus.cancelled if body.kind.value == "cancelled" else RunStatus.failed
    run.status = status.value
    run.failure_kind = body.kind.value
    run.error = body.error
    run.stderr_tail = body.stderr_tail
    if body.fingerprint:
        run.fingerprint = body.fingerprint
    if body.determinism_applied:
        run.determinism_applied = body.determinism_applied
    run.finished_at = utcnow()
    run.lease_expires_at = None
    session.flush()
    studies.refresh_status(session, run.study_id)
    return RunAck(run_id=run.id, status=status)


def release(session: Session, run_id: int, body: RunRelease) -> RunAck:
    """Give the run back to the queue; the attempt does not count and its points are dropped."""
    run = _leased_run(session, run_id, body.lease_id)
    metrics_repo.delete_attempt(session, run.id, run.attempt)
    if run.cancel_requested:
        run.status = RunStatus.cancelled.value
        run.finished_at = utcnow()
    else:
        run.status = RunStatus.queued.value
        run.attempt = max(0, run.attempt - 1)
    run.lease_id = None
    run.lease_expires_at = None
    run.worker_id = None
    session.flush()
    studies.refresh_status(session, run.study_id)
    return RunAck(run_id=run.id, status=RunStatus(run.status))


def _finished_guard(session: Session, run_id: int, lease_id: str) -> Run:
    run = session.scalars(select(Run).where(Run.id == run_id).with_for_update()).first()
    if run is None:
        raise NotFound(f"run {run_id} not found")
    if run.status in studies.TERMINAL:
        raise Conflict(f"run {run_id} is already {run.status}; nothing was changed")
    return _leased_run(session, run_id, lease_id, lock=False)
