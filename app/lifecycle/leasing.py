"""Claiming runs: lease the next queued run a worker can run, and re-queue the runs of dead workers.

Both are conditional UPDATEs on the run's current state (``steady.server.runs.repository``), so a run
is leased by exactly one caller however many API processes and workers race for it.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from steady.server.alerts import quarantine
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


def _spec_for(run: Run, study: Study) -> RunSpec:
    spec = study.spec
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
    )


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
    expired = and_(running, Run.lease_expires_at < now)
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


def _own_blocks_first(session: Session, worker_id: int, candidates: list) -> list:
    """Queued candidates in lease preference order: runs of a block this worker already ran part
    of, then blocks no worker has started, then blocks another worker started; id order within each.

    A block is (study, seed, repeat, stack): one run per determinism level, created next to each
    other (``studies.service.create_study``). Kept on one worker and run one after the other,
    its runs can be compared paired for the cost of determinism (``steady.server.stats.cost``). A
    preference only: a worker still takes another worker's block when nothing else is queued.
    """
    if not candidates:
        return candidates
    blocks = {(c.study_id, c.seed, c.repeat, c.stack) for c in candidates}
    started = runs_repo.started_block_workers(session, {b[0] for b in blocks}, {b[1] for b in blocks})
    workers: dict[tuple, set[int]] = {}
    for study_id, seed, repeat, stack, wid in started:
        if (study_id, seed, repeat, stack) in blocks:
            workers.setdefault((study_id, seed, repeat, stack), set()).add(wid)

    def rank(c) -> tuple[int, int]:
        owners = workers.get((c.study_id, c.seed, c.repeat, c.stack), set())
        return (0 if worker_id in owners else 1 if not owners else 2, c.id)

    return sorted(candidates, key=rank)


def running_in_scope(session: Session, study_id: int | None) -> int:
    """Runs still running under a lease (on any worker) in a lease scope: one study, or the whole queue.
    An external study's open runs (logged through the MLflow-compatible endpoint) hold no lease and never
    come back to the queue, so they are not counted: an agent that exits when idle does not wait on them."""
    stmt = select(func.count()).select_from(Run).where(Run.status == RunStatus.running.value,
                                                       Run.lease_id.is_not(None))
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


def lease_next(session: WriteSession, worker: Worker, settings: Settings, request_id: str | None = None, *,
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
    held = runs_repo.running_count(session, worker_id=worker.id)
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
    # Runs pinned to this worker come first (a fleet check's canary is taken at the worker's next lease, between
    # its jobs, not behind the whole queue); then the others in block preference order.
    pinned = runs_repo.queued_pinned_to(session, worker.id, study_id, CANDIDATES_PER_LEASE)
    mine = {c.id for c in pinned}
    candidates = [c for c in runs_repo.queued_candidates(session, study_id, CANDIDATES_PER_LEASE, worker_id=worker.id)
                  if c.id not in mine]
    for run_id, required, run_study_id, *_ in [*pinned, *_own_blocks_first(session, worker.id, candidates)]:
        if not set(required) <= labels:
            continue
        if builtin_only:
            candidate_study = session.get(Study, run_study_id)
            if candidate_study is None or _is_user_code(candidate_study):
                continue
        if worker.quarantined_at is not None:  # a quarantined worker takes runs only of studies that let it
            candidate_study = session.get(Study, run_study_id)
            if candidate_study is None or quarantine.respects(candidate_study.spec):
                continue
        if not runs_repo.lockable_queued(session, run_id):
            continue
        lease_id = uuid.uuid4().hex
        expires = now + timedelta(seconds=settings.lease_seconds)
        study = session.get(Study, run_study_id)
        assert study is not None
        time_limit_s = float(study.spec.get("time_limit_s", 1800.0))
        claimed = runs_repo.claim(session, run_id, dict(
            status=RunStatus.running.value,
            attempt=Run.attempt + 1,
            lease_id=lease_id,
            lease_expires_at=expires,
            worker_id=worker.id,
            engine=worker.engine,
            started_at=now,
            progress_step=None,
            metric_conflicts=None,  # an earlier attempt's, like its points, are not this attempt's
            # In this one UPDATE: a second UPDATE of the row in the same transaction makes
            # PostgreSQL re-check its foreign keys, taking a KEY SHARE lock on the study row
            # that refresh_status's FOR UPDATE then has to upgrade (deadlocks between leasers).
            time_limit_at=now + timedelta(seconds=time_limit_s + settings.time_limit_grace_seconds),
        ), worker_id=worker.id)
        if not claimed:
            continue
        run = session.get(Run, run_id, populate_existing=True)
        assert run is not None
        metrics_repo.delete_other_attempts(session, run.id, run.attempt)
        lease = _lease_of(run, study, settings, run_credential=run_credential)
        worker.lease_request_id = request_id
        worker.lease_run_id = run.id
        session.flush()
        if study.status != StudyStatus.running:  # a lease only ever moves a study from queued to running
            settled.announce(session, study.id)
        return lease
    return None
