"""The run state machine: lease, heartbeat, metrics, complete, fail, release, reap.

Every transition is a conditional UPDATE on the run's current state, so it succeeds for
exactly one caller however many API processes and workers race for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import and_, func, select, update
from sqlalchemy.orm import Session

from app.config import Settings
from app.auth.service import Role
from app.deps import Principal
from app.errors import Conflict, Forbidden, Invalid, NotFound, TooManyRequests
from app.metrics import repository as metrics_repo
from app.metrics.encoding import json_float
from app.models import Run, Study, Worker, utcnow
from app.runs import credentials
from app.studies import service as studies
from worker.protocol import (
    TERMINAL_RUN_STATUSES,
    ErrorCode,
    Heartbeat,
    HeartbeatAck,
    Lease,
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
    params = dict(workload.get("params") or {})
    arm = next((a for a in spec.get("arms") or [] if a.get("name") == run.stack), {})
    params.update(arm.get("params") or {})
    return RunSpec(
        framework=run.framework,
        workload=workload.get("name"),
        entrypoint=workload.get("entrypoint"),
        command=workload.get("command"),
        capture=workload.get("capture"),
        code_sha256=(spec.get("code") or {}).get("sha256"),
        code_workdir=(spec.get("code") or {}).get("workdir") or ".",
        params=params,
        config_file=arm.get("config"),
        code=arm.get("code"),
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
    overdue = and_(Run.status == RunStatus.running.value, Run.time_limit_at < now)
    study_ids = set(session.scalars(select(Run.study_id).where(overdue)))
    if study_ids:
        # Past its time limit (plus grace) the run is failed whatever its heartbeats say: the
        # agent's own limit is a courtesy, this one holds when the agent is broken or hostile.
        session.execute(
            update(Run)
            .where(overdue)
            .values(
                status=RunStatus.failed.value,
                lease_id=None,
                lease_expires_at=None,
                finished_at=now,
                failure_kind="timeout",
                error="ran past its time limit (time_limit_s plus STEADY_TIME_LIMIT_GRACE_SECONDS); "
                "failed by the server",
            )
        )
    expired = and_(Run.status == RunStatus.running.value, Run.lease_expires_at < now)
    study_ids |= set(session.scalars(select(Run.study_id).where(expired)))
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


def running_in_scope(session: Session, study_id: int | None) -> int:
    """Runs still running (on any worker) in a lease scope: one study, or the whole queue."""
    stmt = select(func.count()).select_from(Run).where(Run.status == RunStatus.running.value)
    if study_id is not None:
        stmt = stmt.where(Run.study_id == study_id)
    return int(session.scalar(stmt) or 0)


def _lease_of(run: Run, study: Study, settings: Settings, *, run_credential: bool = True) -> Lease:
    assert run.lease_id is not None and run.lease_expires_at is not None
    if not run_credential:
        run.run_token_hash = None  # a credential of an earlier lease must not outlive it
    return Lease(
        run_id=run.id,
        study_id=run.study_id,
        attempt=run.attempt,
        lease_id=run.lease_id,
        lease_expires_at=run.lease_expires_at,
        heartbeat_seconds=settings.heartbeat_seconds,
        spec=_spec_for(run, study),
        run_token=credentials.issue(run) if run_credential else None,  # new per answer; only its hash is kept
    )


def _is_user_code(study: Study) -> bool:
    """The study runs code its submitter supplied (not a built-in workload)."""
    return not (study.spec.get("workload") or {}).get("name")


def lease_next(session: Session, worker: Worker, settings: Settings, request_id: str | None = None, *,
               study_id: int | None = None, builtin_only: bool = False, run_credential: bool = False) -> Lease | None:
    """Lease the next queued run this worker can run, or None.

    A request repeating the ``request_id`` of this worker's last granted lease (its answer was
    lost) gets that lease again while the worker still holds it, and never a second run.
    ``study_id`` limits the lease to that study's runs (agents launched for one study).
    """
    now = utcnow()
    reap_expired(session, now)
    # Lock the worker row: one lease decision per worker at a time, so a retry racing its
    # original and the per-worker cap cannot both pass.
    locked = session.scalars(
        select(Worker).where(Worker.id == worker.id).with_for_update().execution_options(populate_existing=True)
    ).one()
    worker = locked
    worker.last_seen_at = now
    if request_id is not None and worker.lease_request_id == request_id and worker.lease_run_id is not None:
        run = session.get(Run, worker.lease_run_id, populate_existing=True)
        if run is not None and run.status == RunStatus.running.value and run.worker_id == worker.id:
            study = session.get(Study, run.study_id)
            assert study is not None
            return _lease_of(run, study, settings, run_credential=run_credential)
        return None  # that lease is gone already (expired and reaped, or finished)
    held = session.scalar(
        select(func.count()).select_from(Run).where(Run.status == RunStatus.running.value, Run.worker_id == worker.id)
    )
    if held >= settings.max_leases_per_worker:
        raise TooManyRequests(
            f"worker {worker.id} already holds {held} leases, the limit per worker "
            f"(STEADY_MAX_LEASES_PER_WORKER={settings.max_leases_per_worker}); finish or release one first",
            code="lease_cap",
        )
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
    if study_id is not None:
        stmt = stmt.where(Run.study_id == study_id)
    for run_id, required, run_study_id, *_ in _own_blocks_first(session, worker.id, session.execute(stmt).all()):
        if not set(required) <= labels:
            continue
        if builtin_only:
            candidate_study = session.get(Study, run_study_id)
            if candidate_study is None or _is_user_code(candidate_study):
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
        study = session.get(Study, run_study_id)
        assert study is not None
        time_limit_s = float(study.spec.get("time_limit_s", 1800.0))
        result = session.execute(
            update(Run)
            .where(Run.id == run_id, Run.status == RunStatus.queued.value)
            .values(
                status=RunStatus.running.value,
                attempt=Run.attempt + 1,
                lease_id=lease_id,
                lease_expires_at=expires,
                worker_id=worker.id,
                engine=worker.engine,
                started_at=now,
                progress_step=None,
                # In this one UPDATE: a second UPDATE of the row in the same transaction makes
                # PostgreSQL re-check its foreign keys, taking a KEY SHARE lock on the study row
                # that refresh_status's FOR UPDATE then has to upgrade (deadlocks between leasers).
                time_limit_at=now + timedelta(seconds=time_limit_s + settings.time_limit_grace_seconds),
            )
        )
        if result.rowcount != 1:
            continue
        run = session.get(Run, run_id, populate_existing=True)
        assert run is not None
        metrics_repo.delete_other_attempts(session, run.id, run.attempt)
        lease = _lease_of(run, study, settings, run_credential=run_credential)
        worker.lease_request_id = request_id
        worker.lease_run_id = run.id
        session.flush()
        if study.status != "running":  # a lease only ever moves a study from queued to running
            studies.refresh_status(session, study.id)
        return lease
    return None


def _already_finished(run: Run) -> Conflict:
    return _finished(run.id, run.status)


def _finished(run_id: int, status: str) -> Conflict:
    return Conflict(f"run {run_id} is already {status}; nothing was changed", code=ErrorCode.already_finished.value)


_TERMINAL = frozenset(s.value for s in TERMINAL_RUN_STATUSES)


def verify_lease(run_id: int, status: str, run_lease_id: str | None, lease_expires_at: datetime | None,
                  holder_token_id: Callable[[], int | None], lease_id: str, principal: Principal) -> None:
    """Raise unless ``lease_id`` is the run's live lease and the caller's token is the leasing worker's."""
    if status in _TERMINAL and run_lease_id in (lease_id, None):
        raise _finished(run_id, status)
    if run_lease_id != lease_id or status != RunStatus.running.value:
        raise Conflict(
            f"lease lost: run {run_id} is no longer leased under this lease (it was re-queued or taken over)",
            code=ErrorCode.lease_lost.value,
        )
    if principal.role is not Role.admin and holder_token_id() != principal.token_id:
        raise Forbidden(
            f"run {run_id} is leased by another worker; only the worker holding the lease may write to it",
            code=ErrorCode.not_lease_holder.value,
        )
    if lease_expires_at is not None and lease_expires_at < utcnow():
        raise Conflict(
            f"lease lost: the lease of run {run_id} expired at {lease_expires_at.isoformat()}",
            code=ErrorCode.lease_lost.value,
        )


def _leased_run(session: Session, run_id: int, lease_id: str, principal: Principal, *, lock: bool = True) -> Run:
    """The run, if ``lease_id`` is its live lease and the caller's token is the leasing worker's."""
    stmt = select(Run).where(Run.id == run_id)
    if lock:
        stmt = stmt.with_for_update()
    run = session.scalars(stmt).first()
    if run is None:
        raise NotFound(f"run {run_id} not found")
    verify_lease(run.id, run.status, run.lease_id, run.lease_expires_at,
                  lambda: session.scalar(select(Worker.token_id).where(Worker.id == run.worker_id)), lease_id, principal)
    return run


def heartbeat(session: Session, run_id: int, body: Heartbeat, settings: Settings, principal: Principal) -> HeartbeatAck:
    run = _leased_run(session, run_id, body.lease_id, principal)
    now = utcnow()
    run.lease_expires_at = now + timedelta(seconds=settings.lease_seconds)
    if body.step is not None:
        run.progress_step = body.step
    if run.worker_id is not None:
        session.execute(update(Worker).where(Worker.id == run.worker_id).values(last_seen_at=now))
    session.flush()
    return HeartbeatAck(lease_expires_at=run.lease_expires_at, cancel=run.cancel_requested)


def check_limits(session: Session, run: Run, batch_keys: set[str], points: int, settings: Settings) -> None:
    """Refuse (422) a write that would take the run's current attempt over its key or point limit
    (writes outside the worker's batch path, e.g. the MLflow-compatible endpoint)."""
    keys, stored = metrics_repo.attempt_usage(session, run.id, run.attempt)
    check_run_limits(run.id, len(keys | batch_keys), stored + points, settings)


def check_run_limits(run_id: int, keys: int, points: int, settings: Settings) -> None:
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


def _duplicate(run: Run, request_id: str | None) -> RunAck | None:
    """The original acknowledgement, when this transition repeats the last one applied."""
    if request_id is not None and run.transition_request_id == request_id and run.transition_status:
        return RunAck(run_id=run.id, status=RunStatus(run.transition_status), duplicate=True)
    return None


def _applied(run: Run, request_id: str | None) -> None:
    run.transition_request_id = request_id
    run.transition_status = run.status


def complete(session: Session, run_id: int, body: RunResult, principal: Principal) -> RunAck:
    run = _locked_run(session, run_id)
    if (ack := _duplicate(run, body.request_id)) is not None:
        return ack
    run = _leased_run(session, run_id, body.lease_id, principal, lock=False)
    now = utcnow()
    run.status = RunStatus.completed.value
    run.final_metrics = {k: json_float(v) for k, v in body.final_metrics.items()}
    run.digests = body.digests.model_dump(mode="json")
    run.fingerprint = body.fingerprint
    run.determinism_applied = body.determinism_applied
    run.timings = {k: json_float(v) for k, v in body.timings.items()}
    run.finished_at = now
    run.lease_expires_at = None
    _applied(run, body.request_id)
    metrics_repo.delete_other_attempts(session, run.id, run.attempt)
    session.flush()
    studies.refresh_status(session, run.study_id)
    return RunAck(run_id=run.id, status=RunStatus.completed)


def fail(session: Session, run_id: int, body: RunFailure, principal: Principal) -> RunAck:
    run = _locked_run(session, run_id)
    if (ack := _duplicate(run, body.request_id)) is not None:
        return ack
    run = _leased_run(session, run_id, body.lease_id, principal, lock=False)
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
    _applied(run, body.request_id)
    session.flush()
    studies.refresh_status(session, run.study_id)
    return RunAck(run_id=run.id, status=status)


def release(session: Session, run_id: int, body: RunRelease, principal: Principal) -> RunAck:
    """Give the run back to the queue; the attempt does not count and its points are dropped."""
    run = _locked_run(session, run_id)
    if (ack := _duplicate(run, body.request_id)) is not None:
        return ack
    run = _leased_run(session, run_id, body.lease_id, principal, lock=False)
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
    _applied(run, body.request_id)
    session.flush()
    studies.refresh_status(session, run.study_id)
    return RunAck(run_id=run.id, status=RunStatus(run.status))


def _locked_run(session: Session, run_id: int) -> Run:
    run = session.scalars(select(Run).where(Run.id == run_id).with_for_update()).first()
    if run is None:
        raise NotFound(f"run {run_id} not found")
    return run
