"""Runs outside the lease protocol's transitions: reading a run, storing metric batches, and
excluding a run from judgement.

The run state machine is split by role: ``leasing`` (queued → running, re-queueing expired
leases), ``transitions`` (heartbeat, complete, fail, release), each a conditional UPDATE in
``repository``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from steady.server.kit.auth import Caller
from steady.server.kit.config import Settings
from steady.server.kit.db import WriteSession
from steady.server.kit.errors import Conflict, Invalid
from steady.server.lifecycle.leasing import _spec_for as spec_for
from steady.server.metrics import repository as metrics_repo
from steady.server.models import Run, utcnow
from steady.server.runs import repository as runs_repo
from steady.server.runs.schemas import RunStory
from steady.worker.contract.protocol import RunSpec
from steady.server.studies import service as studies


def get_run(session: Session, run_id: int) -> Run:
    return runs_repo.get_run(session, run_id)


def run_spec(session: Session, run: Run) -> RunSpec:
    """The spec the run's lease gives a worker (the same function), for a replay."""
    return spec_for(run, studies.get_study(session, run.study_id))


def run_story(session: Session, run: Run) -> RunStory:
    """What ``run`` executed: its study's workload, with the arm's params, config file and code
    where the run belongs to an arm (the same choice as the run's lease, ``leasing._spec_for``)."""
    spec = studies.get_study(session, run.study_id).spec
    workload = spec.get("workload") or {}
    arm: dict[str, Any] = next((a for a in spec.get("arms") or [] if a.get("name") == run.stack), {})
    code = arm["code"] if isinstance(arm.get("code"), dict) else spec.get("code") or {}
    return RunStory(
        workload=workload.get("name"), entrypoint=workload.get("entrypoint"), command=workload.get("command"),
        params={**(workload.get("params") or {}), **(arm.get("params") or {})}, config_file=arm.get("config"),
        code_sha256=code.get("sha256"), code_git_commit=code.get("git_commit"),
        code_dirty=code.get("dirty") if code else None,
    )


def check_limits(session: Session, run: Run, batch_keys: set[str], points: int, settings: Settings) -> set[str]:
    """Refuse (422) a write that would take the run's current attempt over its key or point limit
    (writes outside the worker's batch path, e.g. the MLflow-compatible endpoint). Returns those of the keys the
    attempt already holds, for the insert (``metrics_repo.insert_chunks(known=...)``): the run's row is locked
    until commit on PostgreSQL, so they stay so."""
    stored, n_keys, known = metrics_repo.current_usage(session, run.id, batch_keys)
    check_run_limits(run.id, n_keys + len(batch_keys - known), stored + points, settings)
    return known


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
