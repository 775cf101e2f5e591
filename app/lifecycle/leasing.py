"""Claiming runs: lease the next queued run a worker can run, and re-queue the runs of dead workers.

Both are conditional UPDATEs on the run's current state (``steady.server.runs.repository``), so a run
is leased by exactly one caller however many API processes and workers race for it.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, exists, func, select, update
from sqlalchemy.orm import Session

from steady.server.kit.config import Settings
from steady.server.kit.db import WriteSession
from steady.server.kit.errors import TooManyRequests
from steady.server.metrics import repository as metrics_repo
from steady.server.models import Run, Study, Worker, utcnow
from steady.server.lifecycle import credentials
from steady.server.runs import repository as runs_repo
from steady.server.runs import settled
from steady.worker.contract.protocol import Lease, RunSpec, RunStatus, StudyStatus

CANDIDATES_PER_LEASE = 200


def _spec_for(run: Run, study: Study | dict[str, Any]) -> RunSpec:
    """The run's spec, from its study (or the study's spec)."""
    spec = study.spec if isinstance(study, Study) else study
    workload = spec["workload"]
    params = dict(workload.get("params") or {})
    arm: dict[str, Any] = next((a for a in spec.get("arms") or [] if a.get("name") == run.stack), {})
    params.update(arm.get("params") or {})
    arm_code = arm.get("code")
    # An arm with its own archive runs it; others run the study's. (A string is a label of a study
    # created before arms ran their own code: those ran the study's code, and still do.)
    code = arm_code if isinstance(arm_code, dict) else spec.get("code") or {}
    return RunSpec(
        framework=run.framework,
        workload=workload.get("name"),
        entrypoint=workload.get("entrypoint"),
        command=workload.get("command"),
        capture=workload.get("capture"),
        code_sha256=code.get("sha256"),
        code_workdir=code.get("workdir") or ".",
        params=params,
        config_file=arm.get("config"),
        code=arm_code.get("sha256") if isinstance(arm_code, dict) else arm_code,
        seed=run.seed,
        repeat=run.repeat,
        determinism=run.determinism,
        threads=spec.get("threads", 2),
        time_limit_s=spec.get("time_limit_s", 1800.0),
        metrics=[m["name"] for m in spec.get("metrics", [])],
        stack=run.stack,
        localize_steps=spec.get("localize") == "steps",
        resume=_resume_for(run, spec),
        distributed=arm.get("distributed") or workload.get("distributed"),
        packages=_packages_for(run, spec, arm),
    )


def _packages_for(run: Run, spec: dict[str, Any], arm: dict[str, Any]) -> dict[str, str]:
    """The pinned packages of the run's stack: its arm's stack, else the spec's stack of that name."""
    stack = arm.get("stack") or next((s for s in spec.get("stacks") or [] if s.get("name") == run.stack), None)
    return dict((stack or {}).get("packages") or {})


def _resume_for(run: Run, spec: dict[str, Any]) -> dict[str, Any] | None:
    """The study's resume check, for the runs it selects: the first ``runs`` seeds, first repeat."""
    resume = spec.get("resume")
    if not resume or run.repeat != 0 or run.seed not in (spec.get("seeds") or [])[: int(resume.get("runs", 1))]:
        return None
    return dict(resume)


def reap_expired(session: WriteSession, now: datetime | None = None) -> list[int]:
    """Re-queue runs whose lease expired, or fail them once their attempts are spent.

    Safe to run in every API process at once: each UPDATE only matches runs still expired.
    """
    now = now or utcnow()
    running = Run.status == RunStatus.running.value
    overdue = and_(running, Run.time_limit_at < now)
    expired = and_(running, Run.lease_expires_at < now)
    unclaimed = and_(Run.status == RunStatus.queued.value, Run.pinned_worker.is_not(None), Run.pinned_until < now)
    # Every lease calls this, and there is seldom anything to do: one statement says whether there is.
    if not session.scalar(select(exists().where(overdue | expired) | exists().where(unclaimed))):
        return []
    study_ids = runs_repo.studies_of_runs(session, overdue)
    if study_ids:
        # Past its time limit (plus grace) the run is failed whatever its heartbeats say: the
        # agent's own limit is a courtesy, this one holds when the agent is broken or hostile.
        runs_repo.update_where(session, overdue, dict(
            status=RunStatus.failed.value,
            lease_id=None,
            lease_expires_at=None,
            finished_at=now,
            failure_kind="timeout",
            error="ran past its time limit (time_limit_s plus STEADY_TIME_LIMIT_GRACE_SECONDS); "
            "failed by the server",
        ))
    study_ids |= _fail_unclaimed_pins(session, now)
    study_ids |= runs_repo.studies_of_runs(session, expired)
    if not study_ids:
        return []
    runs_repo.update_where(
        session, and_(expired, Run.attempt < Run.max_attempts, Run.cancel_requested.is_(False)),
        dict(status=RunStatus.queued.value, lease_id=None, lease_expires_at=None, worker_id=None),
    )
    runs_repo.update_where(
        session, and_(expired, Run.cancel_requested.is_(True)),
        dict(status=RunStatus.cancelled.value, lease_id=None, finished_at=now, error="study cancelled"),
    )
    runs_repo.update_where(session, expired, dict(
        status=RunStatus.failed.value,
        lease_id=None,
        finished_at=now,
        failure_kind="lost",
        error="lease expired on the last allowed attempt: the worker stopped heartbeating",
    ))
    for study_id in sorted(study_ids):
        settled.announce(session, study_id)
    return sorted(study_ids)


def _fail_unclaimed_pins(session: WriteSession, now: datetime) -> set[int]:
    """Fail the queued runs pinned to a worker that did not take them by their ``pinned_until`` (the worker
    left, or never came back): a fleet check says so instead of waiting for it forever. Returns their studies."""
    unclaimed = and_(Run.status == RunStatus.queued.value, Run.pinned_worker.is_not(None), Run.pinned_until < now)
    rows = runs_repo.unclaimed_pins(session, unclaimed)
    if not rows:
        return set()
    names = dict(session.execute(select(Worker.id, Worker.name).where(
        Worker.id.in_({r.pinned_worker for r in rows}))).tuples().all())
    studies = set()
    for r in rows:
        who = f"worker {names[r.pinned_worker]} (id {r.pinned_worker})" if r.pinned_worker in names else \
            f"worker id {r.pinned_worker}, no longer registered"
        changed = runs_repo.update_where(session, and_(unclaimed, Run.id == r.id), dict(
            status=RunStatus.failed.value,
            finished_at=now,
            failure_kind="pin_expired",
            error=f"pinned to {who}, which did not take it by {r.pinned_until:%Y-%m-%d %H:%M:%S} UTC: "
            "the worker is gone, or was busy until then",
        ))
        if changed:
            studies.add(r.study_id)
    return studies


def running_in_scope(session: Session, study_id: int | None) -> int:
    """Runs still running under a lease (on any worker) in a lease scope: one study, or the whole queue.
    An external study's open runs (logged through the MLflow-compatible endpoint) hold no lease and never
    come back to the queue, so they are not counted: an agent that exits when idle does not wait on them."""
    stmt = select(func.count()).select_from(Run).where(Run.status == RunStatus.running.value,
                                                       Run.lease_id.is_not(None))
    if study_id is not None:
        stmt = stmt.where(Run.study_id == study_id)
    return int(session.scalar(stmt) or 0)


def _lease_of(run: Run, spec: dict[str, Any], settings: Settings, *, run_credential: bool = True,
              run_token: str | None = None) -> Lease:
    """The lease of ``run`` (its study's ``spec``). ``run_token``: the credential whose hash the lease's UPDATE
    wrote; without it, with ``run_credential``, a new one is issued here."""
    assert run.lease_id is not None and run.lease_expires_at is not None
    if not run_credential:
        if run.run_token_hash is not None:
            run.run_token_hash = None  # a credential of an earlier lease must not outlive it
    elif run_token is None:
        run_token = credentials.issue(run)  # new per answer; only its hash is kept
    return Lease(
        run_id=run.id,
        study_id=run.study_id,
        attempt=run.attempt,
        lease_id=run.lease_id,
        lease_expires_at=run.lease_expires_at,
        heartbeat_seconds=settings.heartbeat_seconds,
        spec=_spec_for(run, spec),
        run_token=run_token if run_credential else None,
    )


def _is_user_code(study: Study) -> bool:
    """The study runs code its submitter supplied (not a built-in workload)."""
    return not (study.spec.get("workload") or {}).get("name")


def lease_next(session: WriteSession, worker: Worker, settings: Settings, request_id: str | None = None, *,
               study_id: int | None = None, builtin_only: bool = False, run_credential: bool = False) -> Lease | None:
    """Lease the next queued run this worker can run, or None.

    A request repeating the ``request_id`` of this worker's last granted lease (its answer was
    lost) gets that lease again while the worker still holds it, and never a second run.
    ``study_id`` limits the lease to that study's runs (agents launched for one study).

    A constant number of statements whatever the queue and however many leasers race: the
    reaper's check, the worker's row, the choice of the run (``runs_repo.pick_queued``: the
    candidates, the pin, label, built-in and quarantine rules, the block preference, the
    per-worker cap and the lock in one query), the claim, the old attempt's points and the
    worker's last lease.
    """
    now = utcnow()
    reap_expired(session, now)
    # Lock the worker row (this UPDATE holds it to the end of the transaction): one lease decision per
    # worker at a time, so a retry racing its original and the per-worker cap cannot both pass.
    seen = session.execute(
        update(Worker).where(Worker.id == worker.id).values(last_seen_at=now)
        .returning(Worker.lease_request_id, Worker.lease_run_id, Worker.labels, Worker.quarantined_at, Worker.engine)
        .execution_options(synchronize_session=False)
    ).one()
    last_request_id, last_run_id, labels, quarantined_at, engine = seen
    if request_id is not None and last_request_id == request_id and last_run_id is not None:
        run = session.get(Run, last_run_id, populate_existing=True)
        if run is not None and run.status == RunStatus.running.value and run.worker_id == worker.id:
            study = session.get(Study, run.study_id)
            assert study is not None
            return _lease_of(run, study.spec, settings, run_credential=run_credential)
        return None  # that lease is gone already (expired and reaped, or finished)
    # Runs pinned to this worker come first (a fleet check's canary is taken at the worker's next lease, between
    # its jobs, not behind the whole queue); then the others in block preference order (``runs_repo.pick_queued``).
    picked = runs_repo.pick_queued(
        session, worker.id, labels or [], study_id=study_id, limit=CANDIDATES_PER_LEASE,
        max_held=settings.max_leases_per_worker, builtin_only=builtin_only, quarantined=quarantined_at is not None)
    if picked is None:
        held = runs_repo.running_count(session, worker_id=worker.id)
        if held >= settings.max_leases_per_worker:
            raise TooManyRequests(
                f"worker {worker.id} already holds {held} leases, the limit per worker "
                f"(STEADY_MAX_LEASES_PER_WORKER={settings.max_leases_per_worker}); finish or release one first",
                code="lease_cap",
            )
        return None
    run_id, run_study_id, spec, study_status = picked
    secret, token_hash = credentials.new(run_id) if run_credential else (None, None)
    time_limit_s = float(spec.get("time_limit_s", 1800.0))
    run = runs_repo.claim_returning(session, run_id, dict(
        status=RunStatus.running.value,
        attempt=Run.attempt + 1,
        lease_id=uuid.uuid4().hex,
        lease_expires_at=now + timedelta(seconds=settings.lease_seconds),
        worker_id=worker.id,
        engine=engine,
        started_at=now,
        progress_step=None,
        metric_conflicts=None,  # an earlier attempt's, like its points, are not this attempt's
        # a new attempt holds no chunks: a release deletes those of the attempt it gives back, and attempt
        # numbers above the current one have none
        stored_points=0,
        stored_keys=0,
        # a credential of an earlier lease must not outlive it: the new one's hash, or none
        run_token_hash=token_hash,
        # In this one UPDATE: a second UPDATE of the row in the same transaction makes
        # PostgreSQL re-check its foreign keys, taking a KEY SHARE lock on the study row
        # that refresh_status's FOR UPDATE then has to upgrade (deadlocks between leasers).
        time_limit_at=now + timedelta(seconds=time_limit_s + settings.time_limit_grace_seconds),
    ))
    if run is None:  # not on PostgreSQL (the row is locked); on SQLite no other writer runs meanwhile
        return None
    metrics_repo.delete_other_attempts(session, run.id, run.attempt)
    session.execute(update(Worker).where(Worker.id == worker.id).values(lease_request_id=request_id,
                                                                         lease_run_id=run.id))
    if study_status != StudyStatus.running:  # a lease only ever moves a study from queued to running
        settled.announce(session, run_study_id)
    return _lease_of(run, spec, settings, run_credential=run_credential, run_token=secret)
