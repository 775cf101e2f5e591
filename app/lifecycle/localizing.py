"""Localization jobs: the server hands the replay of two diverging repeats to a worker.

`steady localize STUDY` replays the pair on the user's machine; a localization job lets the run page's
Localize button (or ``POST /api/v1/studies/{id}/localization-jobs``) ask a worker to do the same. The
job's life follows a run's: ``pending → running`` for exactly one worker (a conditional UPDATE on the
job's state), heartbeats extend the lease and carry a cancel, an expired lease sends the job back to
``pending`` (once) or fails it, and each transition is checked against the lease and repeatable with
its request id. The worker runs the same replay driver as the CLI and posts the driver's answer, which
is kept where the CLI's is (``reports.localizations.keep``): the report, the API and the dashboard show it.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import and_, func, select, update
from sqlalchemy.orm import Session

from steady.server.alerts import quarantine
from steady.server.kit.auth import Caller, Role
from steady.server.kit.config import Settings
from steady.server.kit.db import WriteSession
from steady.server.kit.deps import Principal
from steady.server.kit.errors import Conflict, Forbidden, Invalid, NotFound
from steady.server.kit.repository import paginate
from steady.server.lifecycle.leasing import _spec_for as spec_for
from steady.server.metrics import repository as metrics_repo
from steady.server.models import LocalizationJob, Run, Study, Worker, utcnow
from steady.server.reports import localizations
from steady.server.reports.parts import Localization
from steady.server.studies import service as studies
from steady.worker.contract.oplocate import STEP_DIGEST_KEY, recorded_divergence
from steady.worker.contract.protocol import (
    ErrorCode,
    FailureKind,
    LocalizationAck,
    LocalizationDone,
    LocalizationFailure,
    LocalizationHeartbeat,
    LocalizationHeartbeatAck,
    LocalizationLease,
    LocalizationRelease,
    LocalizationStatus,
)

MAX_ATTEMPTS = 2  # a job whose worker vanished is leased once more, then failed
SETUP_SECONDS = 120.0  # a replay's allowance beyond the study's time limit per pair: code, interpreters, tracing
REPLAYABLE = ("torch", "tensorflow")
NOT_REPLAYABLE = "localization replays PyTorch (op by op) or Keras (layer by layer) training"


class LocalizationJobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runs: list[int] = Field(min_length=2, max_length=2, description="two repeats (same seed, determinism and "
                            "stack) of the study whose values part")


class LocalizationJobOut(BaseModel):
    id: int
    study_id: int
    run_ids: list[int]
    status: LocalizationStatus = Field(description="pending: waiting for a worker; running: a worker replays the "
                                       "pair; done: the answer is kept in the report; failed: no answer (see "
                                       "error); cancelled")
    step: int | None = Field(None, description="the first divergent step, when the runs recorded step digests")
    attempt: int
    worker_id: int | None = None
    worker_name: str | None = None
    cancel_requested: bool = False
    error: str | None = None
    result: Localization | None = Field(None, description="the answer, as kept in the study's report")
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None


def job_out(session: Session, job: LocalizationJob) -> LocalizationJobOut:
    worker = session.get(Worker, job.worker_id) if job.worker_id is not None else None
    result = None
    if job.result:
        try:
            result = Localization.model_validate(job.result)
        except ValueError:
            result = None
    return LocalizationJobOut(
        id=job.id, study_id=job.study_id, run_ids=[job.run_a, job.run_b], status=LocalizationStatus(job.status),
        step=job.step, attempt=job.attempt, worker_id=job.worker_id, worker_name=worker.name if worker else None,
        cancel_requested=job.cancel_requested, error=job.error, result=result, created_at=job.created_at,
        started_at=job.started_at, finished_at=job.finished_at,
    )


# --- users: ask, read, cancel ---------------------------------------------------------------------


def _active_for_pair(session: Session, study_id: int, pair: tuple[int, int]) -> LocalizationJob | None:
    a, b = sorted(pair)
    return session.scalars(select(LocalizationJob).where(
        LocalizationJob.study_id == study_id,
        LocalizationJob.status.in_(LocalizationStatus.ACTIVE),
        ((LocalizationJob.run_a == a) & (LocalizationJob.run_b == b))
        | ((LocalizationJob.run_a == b) & (LocalizationJob.run_b == a)),
    )).first()


def _recorded_step(session: Session, pair: tuple[int, int]) -> tuple[int | None, int] | None:
    """What the runs' recorded step digests say (a study with ``localize: steps``); None when they have none."""
    found = metrics_repo.load_series(session, list(pair), [STEP_DIGEST_KEY])
    series = [found.get((run_id, STEP_DIGEST_KEY)) for run_id in pair]
    if any(s is None or len(s[0]) == 0 for s in series):
        return None
    a, b = ({int(k): float(v) for k, v in zip(*s, strict=True)} for s in series if s is not None)
    return recorded_divergence(a, b)


def request(session: WriteSession, study_id: int, body: LocalizationJobRequest, caller: Caller) -> LocalizationJob:
    """A pending job for the pair (the study's owner or an admin). 422 naming ``runs`` when they are not two
    repeats of the study a worker can replay; 409 when one is already pending or running for the pair.

    When the runs recorded their step digests and these agree at every step, nothing needs replaying: the
    answer ("identical") is kept at once, as `steady localize` does, and the job is done."""
    # One active job per pair. On PostgreSQL (read committed) two requests that overlap would both find none and
    # both insert: the study's row, locked until this transaction ends, makes the second wait and then see the
    # first's job
    study = studies.get_study(session, study_id, lock=True)
    studies.ensure_study_owner(study, caller)
    field = ("body", "runs")
    a, b = localizations.check_pair(session, study_id, body.runs, field)
    if study.kind != "managed" or not study.spec.get("workload"):
        raise Invalid(field, f"runs {a.id} and {b.id} were uploaded to an external study: Steady has no code of "
                      "theirs to replay (localize where the training runs, with `steady localize`)")
    if a.framework not in REPLAYABLE:
        raise Invalid(field, f"{NOT_REPLAYABLE}; runs {a.id} and {b.id} declare framework {a.framework!r}")
    pair = (a.id, b.id)
    if (active := _active_for_pair(session, study_id, pair)) is not None:
        raise Conflict(f"runs {a.id} and {b.id} are already being localized (job {active.id}, "
                       f"{active.status}); cancel it first or wait for its answer", loc=field)
    now = utcnow()
    recorded = _recorded_step(session, pair)
    job = LocalizationJob(study_id=study_id, run_a=a.id, run_b=b.id, status=LocalizationStatus.pending.value,
                          required_labels=list(a.required_labels or []), step=recorded[0] if recorded else None,
                          requested_by=caller.token_id, attempt=0, cancel_requested=False, created_at=now)
    session.add(job)
    session.flush()
    if recorded is not None and recorded[0] is None:
        kept = localizations.keep(session, study, Localization(
            run_ids=list(pair), status="identical", step=None, replays=0, answer=None,
            sentence=f"the runs' training state was identical at all {recorded[1]} steps they recorded: they "
                     "differ outside it (what was logged, evaluation), not in training"))
        job.status, job.result, job.finished_at = LocalizationStatus.done.value, kept.model_dump(mode="json"), now
        session.flush()
    return job


def get_job(session: Session, job_id: int) -> LocalizationJob:
    job = session.get(LocalizationJob, job_id)
    if job is None:
        raise NotFound(f"localization job {job_id} not found")
    return job


def study_jobs(session: Session, study_id: int, *, limit: int, offset: int) -> tuple[list[LocalizationJob], int]:
    studies.get_study(session, study_id)
    return paginate(session, select(LocalizationJob).where(LocalizationJob.study_id == study_id),
                    limit=limit, offset=offset, order_by=LocalizationJob.id.desc())


def recent_jobs(session: Session, study_id: int, run_id: int | None = None, limit: int = 10) -> list[LocalizationJob]:
    """The study's newest jobs (of one run, if given), newest first: what its pages show."""
    stmt = select(LocalizationJob).where(LocalizationJob.study_id == study_id)
    if run_id is not None:
        stmt = stmt.where((LocalizationJob.run_a == run_id) | (LocalizationJob.run_b == run_id))
    return list(session.scalars(stmt.order_by(LocalizationJob.id.desc()).limit(limit)))


def cancel(session: WriteSession, job_id: int, caller: Caller) -> LocalizationJob:
    """A pending job ends at once; a running one is stopped by its worker at the next heartbeat."""
    job = get_job(session, job_id)
    studies.ensure_study_owner(studies.get_study(session, job.study_id), caller)
    now = utcnow()
    session.execute(update(LocalizationJob).where(
        LocalizationJob.id == job.id, LocalizationJob.status == LocalizationStatus.pending.value,
    ).values(status=LocalizationStatus.cancelled.value, finished_at=now, error="cancelled before a worker took it"))
    session.execute(update(LocalizationJob).where(
        LocalizationJob.id == job.id, LocalizationJob.status == LocalizationStatus.running.value,
    ).values(cancel_requested=True))
    session.refresh(job)
    return job


# --- workers: lease, heartbeat, done, fail, release -----------------------------------------------


def pending_count(session: Session, study_id: int | None = None) -> int:
    stmt = select(func.count()).select_from(LocalizationJob).where(
        LocalizationJob.status == LocalizationStatus.pending.value)
    if study_id is not None:
        stmt = stmt.where(LocalizationJob.study_id == study_id)
    return int(session.scalar(stmt) or 0)


def _time_limit_s(study: Study, step: int | None) -> float:
    pairs = 1 if step is not None else 2  # the step known: one pair of replays, else two
    return pairs * (float(study.spec.get("time_limit_s", 1800.0)) + SETUP_SECONDS)


def _lease_of(session: Session, job: LocalizationJob, settings: Settings) -> LocalizationLease:
    study = studies.get_study(session, job.study_id)
    runs = [session.get(Run, r) for r in (job.run_a, job.run_b)]
    assert job.lease_id is not None and job.lease_expires_at is not None and all(runs)
    return LocalizationLease(
        job_id=job.id, study_id=job.study_id, run_ids=[job.run_a, job.run_b], attempt=job.attempt,
        lease_id=job.lease_id, lease_expires_at=job.lease_expires_at, heartbeat_seconds=settings.heartbeat_seconds,
        time_limit_s=_time_limit_s(study, job.step), step=job.step,
        specs=[spec_for(run, study) for run in runs if run is not None],
    )


def lease_next(session: WriteSession, worker: Worker, settings: Settings, request_id: str | None, *,
               study_id: int | None = None, builtin_only: bool = False) -> LocalizationLease | None:
    """Lease the oldest pending job this worker can run, or None. A request repeating the ``request_id`` of a
    job this worker holds gets that lease again, never a second job."""
    now = utcnow()
    reap_expired(session, now)
    worker.last_seen_at = now
    if request_id is not None:
        held = session.scalars(select(LocalizationJob).where(
            LocalizationJob.worker_id == worker.id, LocalizationJob.lease_request_id == request_id)).first()
        if held is not None:
            return _lease_of(session, held, settings) if held.status == LocalizationStatus.running.value else None
    stmt = select(LocalizationJob).where(LocalizationJob.status == LocalizationStatus.pending.value)
    if study_id is not None:
        stmt = stmt.where(LocalizationJob.study_id == study_id)
    labels = set(worker.labels)
    for job in session.scalars(stmt.order_by(LocalizationJob.id).limit(50)).all():
        if not set(job.required_labels or []) <= labels:
            continue
        study = studies.get_study(session, job.study_id)
        if builtin_only and not (study.spec.get("workload") or {}).get("name"):
            continue
        if worker.quarantined_at is not None and quarantine.respects(study.spec):
            continue  # a replay on a quarantined device would localize its fault, not the study's
        lease_id = uuid.uuid4().hex
        claimed = session.execute(update(LocalizationJob).where(
            LocalizationJob.id == job.id, LocalizationJob.status == LocalizationStatus.pending.value,
        ).values(
            status=LocalizationStatus.running.value, attempt=LocalizationJob.attempt + 1, lease_id=lease_id,
            lease_expires_at=now + timedelta(seconds=settings.lease_seconds), worker_id=worker.id,
            lease_request_id=request_id, started_at=now,
            time_limit_at=now + timedelta(seconds=_time_limit_s(study, job.step) + settings.time_limit_grace_seconds),
        ))
        if claimed.rowcount != 1:  # type: ignore[attr-defined]
            continue  # another worker took it in between
        session.refresh(job)
        return _lease_of(session, job, settings)
    return None


def reap_expired(session: WriteSession, now: datetime | None = None) -> int:
    """Jobs past their time limit fail; jobs whose worker stopped heartbeating go back to pending (once), or
    fail, or end cancelled when a cancel was asked. Each an UPDATE of the jobs still in that state."""
    now = now or utcnow()
    running = LocalizationJob.status == LocalizationStatus.running.value
    changed = 0
    for where, values in (
        (and_(running, LocalizationJob.time_limit_at < now), dict(
            status=LocalizationStatus.failed.value, lease_id=None, finished_at=now,
            error="the replays ran past the job's time limit (the study's time_limit_s per pair of replays, plus "
                  "setup and STEADY_TIME_LIMIT_GRACE_SECONDS): failed by the server")),
        (and_(running, LocalizationJob.lease_expires_at < now, LocalizationJob.cancel_requested.is_(True)), dict(
            status=LocalizationStatus.cancelled.value, lease_id=None, finished_at=now, error="cancelled")),
        (and_(running, LocalizationJob.lease_expires_at < now, LocalizationJob.attempt < MAX_ATTEMPTS), dict(
            status=LocalizationStatus.pending.value, lease_id=None, lease_expires_at=None, worker_id=None)),
        (and_(running, LocalizationJob.lease_expires_at < now), dict(
            status=LocalizationStatus.failed.value, lease_id=None, finished_at=now,
            error="the worker replaying the pair stopped heartbeating, on the last allowed attempt")),
    ):
        changed += session.execute(update(LocalizationJob).where(where).values(**values)).rowcount  # type: ignore[attr-defined]
    return changed


def _held(session: WriteSession, job_id: int, lease_id: str, request_id: str | None,
          principal: Principal) -> LocalizationJob | LocalizationAck:
    """The job, if ``lease_id`` is its live lease and the caller's token is its worker's; the original answer
    when ``request_id`` repeats the transition already applied; 409 otherwise."""
    job = session.get(LocalizationJob, job_id, populate_existing=True)
    if job is None:
        raise NotFound(f"localization job {job_id} not found")
    if request_id is not None and job.transition_request_id == request_id:
        return LocalizationAck(job_id=job.id, status=LocalizationStatus(job.status), duplicate=True)
    if job.status in LocalizationStatus.TERMINAL and job.lease_id in (lease_id, None):
        raise Conflict(f"localization job {job_id} is already {job.status}; nothing was changed",
                       code=ErrorCode.already_finished.value)
    if job.lease_id != lease_id or job.status != LocalizationStatus.running.value:
        raise Conflict(f"lease lost: localization job {job_id} is no longer leased under this lease",
                       code=ErrorCode.lease_lost.value)
    worker = session.get(Worker, job.worker_id) if job.worker_id is not None else None
    if principal.role is not Role.admin and (worker is None or worker.token_id != principal.token_id):
        raise Forbidden(f"localization job {job_id} is leased by another worker",
                        code=ErrorCode.not_lease_holder.value)
    if job.lease_expires_at is not None and job.lease_expires_at < utcnow():
        raise Conflict(f"lease lost: the lease of localization job {job_id} expired",
                       code=ErrorCode.lease_lost.value)
    return job


def _finish(session: WriteSession, job: LocalizationJob, lease_id: str, request_id: str | None,
            values: dict[str, Any]) -> LocalizationAck:
    """The conditional UPDATE of a held job (still running under ``lease_id``): one racing transition wins."""
    done = session.execute(update(LocalizationJob).where(
        LocalizationJob.id == job.id, LocalizationJob.status == LocalizationStatus.running.value,
        LocalizationJob.lease_id == lease_id,
    ).values(**values, transition_request_id=request_id))
    if done.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict(f"lease lost: localization job {job.id} changed while this request was answered",
                       code=ErrorCode.lease_lost.value)
    return LocalizationAck(job_id=job.id, status=LocalizationStatus(values["status"]))


def heartbeat(session: WriteSession, job_id: int, body: LocalizationHeartbeat, settings: Settings,
              principal: Principal) -> LocalizationHeartbeatAck:
    held = _held(session, job_id, body.lease_id, None, principal)
    assert isinstance(held, LocalizationJob)
    now = utcnow()
    expires = now + timedelta(seconds=settings.lease_seconds)
    session.execute(update(LocalizationJob).where(
        LocalizationJob.id == held.id, LocalizationJob.lease_id == body.lease_id,
        LocalizationJob.status == LocalizationStatus.running.value,
    ).values(lease_expires_at=expires))
    if held.worker_id is not None:
        session.execute(update(Worker).where(Worker.id == held.worker_id).values(last_seen_at=now))
    return LocalizationHeartbeatAck(lease_expires_at=expires, cancel=held.cancel_requested)


def complete(session: WriteSession, job_id: int, body: LocalizationDone, principal: Principal) -> LocalizationAck:
    """Keep the replays' answer as `steady localize` keeps it (422 when it is not a valid one)."""
    held = _held(session, job_id, body.lease_id, body.request_id, principal)
    if isinstance(held, LocalizationAck):
        return held
    try:
        answer = Localization.model_validate({
            "run_ids": [held.run_a, held.run_b], "status": body.status, "step": body.step,
            "replays": body.replays, "answer": body.answer, "sentence": body.sentence})
    except ValueError as exc:
        raise Invalid(("body",), f"not a localization answer: {exc}") from None
    kept = localizations.keep(session, studies.get_study(session, held.study_id), answer)
    return _finish(session, held, body.lease_id, body.request_id, dict(
        status=LocalizationStatus.done.value, result=kept.model_dump(mode="json"), finished_at=utcnow(),
        step=body.step, lease_expires_at=None))


def fail(session: WriteSession, job_id: int, body: LocalizationFailure, principal: Principal) -> LocalizationAck:
    held = _held(session, job_id, body.lease_id, body.request_id, principal)
    if isinstance(held, LocalizationAck):
        return held
    status = LocalizationStatus.cancelled if body.kind is FailureKind.cancelled else LocalizationStatus.failed
    return _finish(session, held, body.lease_id, body.request_id, dict(
        status=status.value, error=body.error, finished_at=utcnow(), lease_expires_at=None))


def release(session: WriteSession, job_id: int, body: LocalizationRelease, principal: Principal) -> LocalizationAck:
    """Back to pending for another worker (the agent is shutting down); the attempt is not counted."""
    held = _held(session, job_id, body.lease_id, body.request_id, principal)
    if isinstance(held, LocalizationAck):
        return held
    if held.cancel_requested:
        return _finish(session, held, body.lease_id, body.request_id, dict(
            status=LocalizationStatus.cancelled.value, error="cancelled", finished_at=utcnow()))
    return _finish(session, held, body.lease_id, body.request_id, dict(
        status=LocalizationStatus.pending.value, attempt=LocalizationJob.attempt - 1, worker_id=None, lease_id=None,
        lease_expires_at=None, started_at=None, lease_request_id=None))
