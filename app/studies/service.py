"""Study lifecycle: validate and expand a spec into runs, track status, cancel, uploads."""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np
from sqlalchemy.orm import Session

from steady.server.kit.auth import Caller, Role, ensure_may_change
from steady.server.kit.config import Settings
from steady.server.kit.db import WriteSession
from steady.server.kit.errors import Conflict, Forbidden, Invalid
from steady.server.metrics import repository as metrics_repo
from steady.server.kit.wire import wire_float
from steady.server.models import Run, Study, utcnow
from steady.server.studies import adaptive, fleet, repository
from steady.server.studies.fleet_spec import FleetWorker
from steady.server.studies.queue import insert_runs
from steady.server.runs import repository as runs_repo
from steady.server.runs.schemas import ExternalRunIn
from steady.server.studies.schemas import StudyOut, StudySpec, StudySummary
from steady.server.studies.spec_parts import CodeRef
from steady.worker.contract import codepack
from steady.worker.contract.protocol import STEP_TIME_KEY, STEP_TIME_KEYS, RunStatus, StudyStatus


def ensure_suite_owner(session: Session, suite: str, caller: Caller) -> None:
    """A suite belongs to the owner of its first study: only they (and admins) add to it or set its
    baseline and rules, so no other user can shift a suite's history or alerts."""
    if caller.role == Role.admin:
        return
    first = repository.first_study_of_suite(session, suite)
    if first is not None and first.owner_token_id != caller.token_id:
        raise Forbidden(
            f"suite {suite!r} belongs to another user (the owner of its first study, {first.id}): only they "
            "or an admin may add studies, rules or a baseline to it"
        )


def ensure_study_owner(study: Study, caller: Caller) -> None:
    ensure_may_change(caller, study.owner_token_id, f"study {study.id}")


def create_study(session: WriteSession, spec: StudySpec, settings: Settings, caller: Caller) -> Study:
    if spec.kind == "managed" and spec.budget is not None and (
            spec.max_seeds * spec.runs_per_seed > settings.max_runs_per_study):
        raise Invalid(
            ("body", "budget", "max_seeds"),
            f"the budget allows {spec.max_seeds} seeds × {spec.runs_per_seed} runs per seed = "
            f"{spec.max_seeds * spec.runs_per_seed} runs, over the limit of {settings.max_runs_per_study} runs per "
            "study (STEADY_MAX_RUNS_PER_STUDY): lower max_seeds or set max_runs",
        )
    pool = None
    if spec.fleet is not None and spec.workload is not None:
        pool = fleet.resolve_pool(session, spec.fleet, spec.workload.framework.value)
        spec = spec.model_copy(update={"fleet": spec.fleet.model_copy(
            update={"pool": [FleetWorker(id=w.id, name=w.name) for w in pool]})})
    if spec.kind == "managed" and spec.run_count > settings.max_runs_per_study:
        raise Invalid(
            ("body", "seeds"),
            f"the matrix seeds × repeats × determinism × {'arms' if spec.arms else 'stacks'} is {len(spec.seeds)} × "
            f"{spec.repeats} × {len(spec.determinism)} × {len(spec.groups)} = {spec.run_count} runs, over the limit of "
            f"{settings.max_runs_per_study} runs per study (STEADY_MAX_RUNS_PER_STUDY)",
        )
    if spec.suite:
        ensure_suite_owner(session, spec.suite, caller)
    ref_study = spec.convergence.reference.study if spec.convergence else None
    if ref_study is not None and session.get(Study, ref_study) is None:
        raise Invalid(("body", "convergence", "reference", "study"), f"study {ref_study} not found")
    check_code(session, spec)
    code = spec.code
    study = Study(
        owner_token_id=caller.token_id,
        name=spec.name,
        kind=spec.kind,
        status=StudyStatus.open.value if spec.kind == "external" else StudyStatus.queued.value,
        spec=spec.model_dump(mode="json"),
        suite=spec.suite,
        code_sha256=code.sha256 if code else None,
        code_git_commit=code.git_commit if code else None,
        code_dirty=code.dirty if code else None,
    )
    session.add(study)
    session.flush()
    if pool is not None and spec.fleet is not None and spec.workload is not None:
        fleet.insert_fleet_runs(session, study, pool, seed=spec.seeds[0], repeats=spec.fleet.repeats,
                                framework=spec.workload.framework.value, max_attempts=spec.max_attempts,
                                wait_s=spec.fleet.wait_s)
    elif spec.kind == "managed":
        insert_runs(session, study, spec, spec.seeds)
        adaptive.start(session, study, spec)
    return study


def check_code(session: Session, spec: StudySpec) -> None:
    """Every archive the spec names is uploaded, and the entrypoint's file or the command's script
    is in each archive a run executes (relative to its workdir, or a module from its top): each
    arm's own code, and the study's code when some run executes it (no arms, or an arm without
    code). Without code the entrypoint is resolved in each worker's own directory."""
    arms = spec.arms or []
    for i, arm in enumerate(arms):
        loc = ("body", "arms", i, "code")
        if isinstance(arm.code, str):
            raise Invalid(loc, f"arm {arm.name!r}: code {arm.code!r} is not an uploaded archive; give "
                          "{sha256: <64 hex>} of one uploaded with PUT /api/v1/code/{sha256} "
                          "(`steady submit` packs and uploads `code: DIR`, a folder next to the spec)")
        if arm.code is not None:
            _check_archive(session, spec, arm.code, f"arm {arm.name!r}'s code", loc)
    if spec.code is not None:
        used = not arms or any(a.code is None for a in arms)
        _check_archive(session, spec, spec.code, "the study's code", None, files=used)


def _check_archive(session: Session, spec: StudySpec, code: CodeRef, what: str, loc: tuple[str | int, ...] | None,
                   *, files: bool = True) -> None:
    """``code``'s archive is on the server and (with ``files``) holds the workload's file; ``loc`` is the
    field a 422 names (None: the study's own ``code`` and ``workload`` fields)."""
    from steady.server.code import repository as code_repo  # the code domain sits beside this one

    archive = code_repo.get(session, code.sha256)
    if archive is None:
        raise Invalid(loc or ("body", "code", "sha256"), f"no code archive {code.sha256} on the server "
                      f"({what}): upload it first with PUT /api/v1/code/{{sha256}} (steady submit does)")
    workload = spec.workload
    if not files or workload is None:
        return
    names = set(archive.files)
    where = f"{what} (archive {code.sha256[:12]}, directory {code.workdir!r}, {len(names)} files)"
    if workload.entrypoint is not None:
        target = codepack.entrypoint_file(workload.entrypoint)
        module = not workload.entrypoint.partition(":")[0].endswith(".py")
        if not (codepack.present(target, names, code.workdir) or (module and codepack.present(target, names))):
            raise Invalid(loc or ("body", "workload", "entrypoint"),
                          f"the entrypoint's file {target} is not in {where}")
    if workload.command is not None:
        script = codepack.script_of(workload.command)
        if script is not None and not codepack.present(script, names, code.workdir):
            raise Invalid(loc or ("body", "workload", "command"), f"the command's script {script} is not in {where}")


def get_study(session: Session, study_id: int, *, lock: bool = False) -> Study:
    return repository.get_study(session, study_id, lock=lock)


@overload
def to_out(session: Session, studies: list[Study], *, summary: Literal[False] = False) -> list[StudyOut]: ...
@overload
def to_out(session: Session, studies: list[Study], *, summary: bool) -> list[StudySummary]: ...
def to_out(session: Session, studies: list[Study], *, summary: bool = False) -> Sequence[StudySummary]:
    """API views of ``studies``; ``summary`` leaves the spec out (lists)."""
    progress = repository.progress_by_study(session, [s.id for s in studies])
    stages = repository.current_stages(session, [s.id for s in studies if s.spec.get("budget")])
    cls = StudySummary if summary else StudyOut
    return [
        cls(
            id=s.id,
            name=s.name,
            kind=s.kind,
            status=s.status,
            suite=s.suite,
            created_at=s.created_at,
            updated_at=s.updated_at,
            finished_at=s.finished_at,
            progress=progress[s.id],
            owner_token_id=s.owner_token_id,
            code_sha256=s.code_sha256,
            code_git_commit=s.code_git_commit,
            code_dirty=s.code_dirty,
            status_reason=s.status_reason,
            stage=adaptive.stage_info(s, *stages[s.id]) if s.id in stages else None,
            **({} if summary else {"spec": s.spec}),
        )
        for s in studies
    ]


def refresh_status(session: WriteSession, study_id: int, *, report_of: adaptive.ReportOf | None) -> Study:
    """Derive a managed study's status from its runs; call after any run transition.

    ``report_of`` judges a settled stage of an adaptive study (``adaptive.judge_stage``); None only
    where no stage can settle (cancelling).

    The study row is locked first, so concurrent transitions of its runs (several workers
    finishing at once, on several API processes) recount one after another: on PostgreSQL
    each would otherwise count the others' runs as still running and leave the study running.
    """
    study = repository.get_study(session, study_id, lock=True)
    if study.kind == "external":
        return study
    # While the row is locked: whether runs are queued, running, finished (index probes); the runs are
    # counted only when none is queued or running, where the counts decide how the study ends.
    queued, running, finished = runs_repo.study_activity(session, study_id)
    p = None if queued or running else repository.progress_by_study(session, [study_id])[study_id]
    before = study.status
    if p is not None and p.total and p.queued == 0 and p.running == 0:
        if study.status == StudyStatus.cancelled or p.cancelled == p.total:
            status = StudyStatus.cancelled
        elif p.failed == p.total:
            status = StudyStatus.failed
        elif adaptive.judge_stage(session, study, report_of):
            status = StudyStatus.running  # the next stage's seeds are queued
        else:
            status = StudyStatus.completed
    elif study.status == StudyStatus.cancelled:
        status = StudyStatus.cancelled  # waiting for running runs to stop
    elif running or finished:
        status = StudyStatus.running
    else:
        status = StudyStatus.queued
    if status.value in StudyStatus.JUDGED and before not in StudyStatus.TERMINAL:
        status, study.status_reason = _judge_outcome(session, study, status)
    if status != before:
        study.status = status.value
        if status.value in StudyStatus.TERMINAL:
            study.finished_at = utcnow()
        session.flush()
        if status.value in StudyStatus.JUDGED and before not in StudyStatus.TERMINAL:
            on_study_finished(session, study)
    return study


def _judge_outcome(session: Session, study: Study, status: StudyStatus) -> tuple[StudyStatus, str | None]:
    """The final status and its reason: a study whose runs all failed names the first error; one
    whose completed runs logged none of its metrics fails; a metric no run logged is named with
    the keys that were logged instead."""
    if status == StudyStatus.failed:
        first = runs_repo.first_failed_run(session, study.id)
        if first is None:
            return status, None
        line = (first.error or "no error text").strip().splitlines()[0] if (first.error or "").strip() else "no error text"
        return status, f"every run failed; first: run {first.id}: {line[:500]}"
    wanted = [m["name"] for m in study.spec.get("metrics", [])]
    logged = sorted(metrics_repo.study_metric_keys(session, study.id) - set(STEP_TIME_KEYS))
    missing = [m for m in wanted if m not in logged]
    if not missing:
        return status, None
    parts = []
    for m in missing:
        close = difflib.get_close_matches(m, logged, n=1)
        parts.append(f"metric {close[0]!r} was logged where the spec names {m!r}" if close
                     else f"the spec names metric {m!r} but no run logged it")
    reason = "; ".join(parts) + f"; runs logged: {', '.join(logged) if logged else 'no metric at all'}"
    if len(missing) == len(wanted):
        return StudyStatus.failed, "no run logged any of the study's metrics: " + reason + _capture_hint(
            session, study, missing)
    return status, reason


def _capture_hint(session: Session, study: Study, missing: Sequence[str]) -> str:
    """A command's output that capture read and matched nothing in: what it tried and one line it did not
    match (the last that names a missing metric, else the last), so the fix (a pattern) is in sight."""
    workload = study.spec.get("workload") or {}
    capture = workload.get("capture") or {}
    if not workload.get("command") or capture.get("stdout") is False:
        return ""
    run = runs_repo.last_run_with_output(session, study.id)
    if run is None or not run.stderr_tail:
        return ""
    lines = [ln.strip() for ln in run.stderr_tail.splitlines() if ln.strip()]
    named = [ln for ln in lines if any(m.lower() in ln.lower() for m in missing)]
    line = (named or lines or [""])[-1]
    if not line:
        return ""
    if capture.get("patterns") or capture.get("preset"):
        tried = " and ".join(filter(None, [f"the spec's {len(capture['patterns'])} pattern(s)" if capture.get(
            "patterns") else "", f"the {capture['preset']} preset" if capture.get("preset") else ""]))
    else:
        tried = "its default patterns ('step N ... loss X' and tqdm's 'N/T [..., loss=X]')"
    shown = line if len(line) <= 200 else line[:199] + "…"
    return (f"; capture tried {tried} on the output and matched none of it, e.g. run {run.id} printed "
            f"{shown!r}: give workload.capture.patterns a regex with a named group 'step' and one per metric "
            "(docs/spec.md#capture)")


def on_study_finished(session: WriteSession, study: Study) -> None:
    """Run once when a study's last run ends: record that it awaits its alert evaluation (the alerts
    domain stores the spec's rules and judges it, ``steady.server.alerts.jobs``)."""
    repository.request_evaluation(session, study.id)


def cancel_study(session: WriteSession, study_id: int, caller: Caller) -> Study:
    study = get_study(session, study_id)
    ensure_study_owner(study, caller)
    if study.kind == "external":
        raise Conflict(f"study {study_id} is external: it has no runs to cancel")
    if study.status in StudyStatus.JUDGED:
        raise Conflict(f"study {study_id} is already {study.status}")
    now = utcnow()
    runs_repo.cancel_runs_of(session, study_id, now)
    study.status = StudyStatus.cancelled.value
    session.flush()
    return refresh_status(session, study_id, report_of=None)  # a cancelled study stays cancelled


def stack_name_of(fingerprint: dict[str, Any]) -> str:
    name = fingerprint.get("name")
    if isinstance(name, str) and name:
        return name[:100]
    canonical = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"), default=str)
    return "stack-" + hashlib.sha256(canonical.encode()).hexdigest()[:8]


def upload_external_run(
    session: WriteSession, study_id: int, body: ExternalRunIn, settings: Settings, caller: Caller
) -> Run:
    study = get_study(session, study_id)
    ensure_study_owner(study, caller)
    if study.kind != "external":
        raise Conflict(f"study {study_id} is managed: its runs come from workers, not uploads")
    points = sum(len(s.steps) for s in body.metrics.values()) + len(body.step_times or [])
    if points > settings.max_batch_points:
        raise Invalid(
            ("body", "metrics"),
            f"{points} points in one upload, over the limit of {settings.max_batch_points} (STEADY_MAX_BATCH_POINTS)",
        )
    final = {}
    for key, s in body.metrics.items():
        if s.steps:
            final[key] = s.values[int(np.argmax(s.steps))]
    run = Run(
        study_id=study_id,
        seed=body.seed,
        repeat=body.repeat,
        determinism=body.determinism.value,
        stack=stack_name_of(body.stack),
        framework=body.framework,
        required_labels=[],
        status=RunStatus.completed.value,
        attempt=1,
        max_attempts=1,
        fingerprint=body.stack,
        digests=body.digests,
        final_metrics={k: wire_float(v) for k, v in final.items()},
        started_at=utcnow(),
        finished_at=utcnow(),
    )
    session.add(run)
    session.flush()
    series = [
        (key, np.asarray(s.steps, dtype=np.int64), np.asarray(s.values, dtype=np.float64), s.dtype)
        for key, s in body.metrics.items()
    ]
    if body.step_times:
        series.append(
            (STEP_TIME_KEY, np.arange(len(body.step_times), dtype=np.int64), np.asarray(body.step_times, float), None)
        )
    metrics_repo.insert_chunks(session, run.id, 1, 0, series)
    study.updated_at = utcnow()
    return run
