"""The MLflow-compatible tracking API: MLflow runs are Steady runs, experiments are studies.

Two kinds of caller:

* **a run's own process** holding its run-scoped credential (``MLFLOW_TRACKING_TOKEN``, set by
  the worker with ``MLFLOW_RUN_ID``): it reads and writes that one run while its lease lasts.
  ``mlflow.start_run()`` attaches to it; metrics land in the run's current attempt next to
  the SDK's; the run's status stays the worker's to report.
* **a user token**, logging runs from elsewhere into an *external* study: an experiment is an
  external study (``experiments/create`` makes one, ``get-by-name`` finds the caller's),
  ``runs/create`` adds a running run to it, ``runs/update`` with FINISHED completes it (its
  ``seed``, ``repeat`` and ``determinism`` params, when logged, place it in the study's matrix).

Metric points are stored like every other series (columnar chunks, exact float64 bits, NaN
and ±Inf as data). A write is idempotent by content: a request re-sent by the client's retry
stores nothing twice. Values logged at one step with increasing timestamps are a history, as MLflow keeps
them (e.g. ``mlflow.log_metric("loss", v)`` once per epoch, every call at step 0): all are stored in
order, and the step reads the latest, which is the run's final value when it is the last step and what
``runs/get`` answers as the latest metric.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from steady.server.kit.auth import Role, ensure_may_change
from steady.server.kit.config import Settings
from steady.server.kit.db import WriteSession
from steady.server.kit.deps import Principal
from steady.server.metrics import repository as metrics_repo
from steady.server.kit.wire import from_wire, wire_float
from steady.server.mlflow.schemas import (
    MAX_RUN_PARAMS,
    MAX_RUN_PARAMS_TAGS_BYTES,
    MAX_RUN_TAGS,
    CreateExperimentIn,
    CreateRunIn,
    LogBatchIn,
    MetricIn,
    ParamIn,
    TagIn,
    UpdateRunIn,
)
from steady.server.models import Run, Study, utcnow
from steady.server.runs import repository as runs_repo
from steady.server.lifecycle.credentials import RunCredential
from steady.server.studies import service as studies
from steady.server.studies.schemas import StudySpec
from steady.worker.contract.protocol import Determinism, RunStatus

RUN_NAME_TAG = "mlflow.runName"
_STATUS_OUT = {RunStatus.running.value: "RUNNING", RunStatus.queued.value: "SCHEDULED",
               RunStatus.completed.value: "FINISHED", RunStatus.failed.value: "FAILED",
               RunStatus.cancelled.value: "KILLED"}


class MlflowError(Exception):
    """Answered in MLflow's error shape: ``{"error_code": ..., "message": ...}``."""

    def __init__(self, status_code: int, error_code: str, message: str) -> None:
        super().__init__(message)
        self.status_code, self.error_code, self.message = status_code, error_code, message


def _not_found(what: str) -> MlflowError:
    return MlflowError(404, "RESOURCE_DOES_NOT_EXIST", what)


def _invalid(message: str) -> MlflowError:
    return MlflowError(400, "INVALID_PARAMETER_VALUE", message)


def _denied(message: str) -> MlflowError:
    return MlflowError(403, "PERMISSION_DENIED", message)


@dataclass(frozen=True)
class MlflowCaller:
    """Either a run's own credential or a user (admin) token."""

    run: RunCredential | None = None
    principal: Principal | None = None


# --- views -------------------------------------------------------------------------------------


def _ms(dt: Any) -> int | None:
    return int(dt.timestamp() * 1000) if dt is not None else None


def _meta(run: Run) -> dict[str, Any]:
    return dict(run.mlflow or {})


def run_info(run: Run) -> dict[str, Any]:
    meta = _meta(run)
    return {
        "run_id": str(run.id),
        "run_uuid": str(run.id),
        "run_name": meta.get("run_name") or f"run-{run.id}",
        "experiment_id": str(run.study_id),
        "user_id": "",
        "status": _STATUS_OUT.get(run.status, "RUNNING"),  # the run's own state: a worker's run ends when it reports
        "start_time": _ms(run.started_at or run.created_at),
        "end_time": _ms(run.finished_at),
        "artifact_uri": "",
        "lifecycle_stage": "active",
    }


def run_view(session: Session, run: Run) -> dict[str, Any]:
    meta = _meta(run)
    series = metrics_repo.load_series(session, [run.id], None)  # the latest value at each key's last step, as MLflow
    latest = {key: (int(steps[-1]), float(values[-1])) for (_, key), (steps, values) in series.items() if len(steps)}
    if not latest:
        latest = {k: (0, from_wire(v)) for k, v in (run.final_metrics or {}).items()}
    tags = dict(meta.get("tags") or {})
    tags.setdefault(RUN_NAME_TAG, run_info(run)["run_name"])
    return {
        "info": run_info(run),
        "data": {
            "metrics": [{"key": k, "value": wire_float(v), "step": str(s), "timestamp": "0"}
                        for k, (s, v) in sorted(latest.items())],
            "params": [{"key": k, "value": v} for k, v in sorted((meta.get("params") or {}).items())],
            "tags": [{"key": k, "value": v} for k, v in sorted(tags.items())],
        },
        "inputs": {},
    }


def experiment_view(study: Study) -> dict[str, Any]:
    return {
        "experiment_id": str(study.id),
        "name": study.name,
        "artifact_location": "",
        "lifecycle_stage": "active",
        "creation_time": _ms(study.created_at),
        "last_update_time": _ms(study.updated_at),
        "tags": [{"key": "steady.kind", "value": study.kind}],
    }


# --- access ------------------------------------------------------------------------------------


def _run_for_read(session: Session, run_id: int, caller: MlflowCaller) -> Run:
    if caller.run is not None and caller.run.run_id != run_id:
        raise _denied(f"this run credential belongs to run {caller.run.run_id}, not run {run_id}")
    run = runs_repo.find_run(session, run_id)
    if run is None:
        raise _not_found(f"run {run_id} not found")
    return run


def _run_for_write(session: Session, run_id: int, caller: MlflowCaller) -> Run:
    """The run, locked, if the caller may write to it now."""
    if caller.run is not None and caller.run.run_id != run_id:
        raise _denied(f"this run credential belongs to run {caller.run.run_id}; it cannot write to run {run_id}")
    run = runs_repo.find_run(session, run_id, lock=True)
    if run is None:
        raise _not_found(f"run {run_id} not found")
    if caller.run is not None:
        if run.lease_id != caller.run.lease_id or run.status != RunStatus.running.value:
            raise _denied(f"run {run_id}'s lease ended: its credential no longer writes to it")
        return run
    assert caller.principal is not None
    study = session.get(Study, run.study_id)
    assert study is not None
    if study.kind != "external":
        raise _denied(f"run {run_id} belongs to managed study {study.id}: only its own process (with its run "
                      "credential) writes to it; log runs of your own into an external study")
    ensure_may_change(caller.principal, study.owner_token_id, f"study {study.id}")
    if run.status != RunStatus.running.value:
        raise MlflowError(400, "INVALID_STATE", f"run {run_id} is {run.status}: it takes no more writes")
    return run


def _user(caller: MlflowCaller, what: str) -> Principal:
    if caller.principal is None:
        raise _denied(f"a run credential writes to its own run only; {what} needs a user token")
    return caller.principal


# --- writes ------------------------------------------------------------------------------------


def _content_seq(run_id: int, payload: Any) -> int:
    """A negative batch number derived from the request's content: the agent numbers its batches
    from 0 up, so the two never collide, and a retried request maps to the same number."""
    raw = json.dumps(payload, sort_keys=True, default=repr).encode()
    return -1 - (int.from_bytes(hashlib.sha256(str(run_id).encode() + b"\0" + raw).digest()[:8], "big") >> 2)


def _store_metrics(session: Session, run: Run, metrics: list[MetricIn], settings: Settings) -> None:
    if not metrics:
        return
    payload = [(m.key, m.step, m.value.hex(), m.timestamp) for m in metrics]
    seq = _content_seq(run.id, payload)
    if metrics_repo.batch_exists(session, run.id, run.attempt, seq):
        return
    grouped: dict[str, tuple[list[int], list[float]]] = {}
    # a step's values in timestamp order (a stable sort: equal timestamps keep the request's order)
    for m in sorted(metrics, key=lambda m: (int(m.step), int(m.timestamp))):
        steps, values = grouped.setdefault(m.key, ([], []))
        steps.append(int(m.step))
        values.append(float(m.value))
    from steady.server.lifecycle import service as runs

    known = runs.check_limits(session, run, set(grouped), len(metrics), settings)
    grouped = _new_values(session, run, grouped)
    arrays = [(key, np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64)) for key, (s, v) in grouped.items()]
    metrics_repo.insert_chunks(session, run.id, run.attempt, seq, arrays, known=known)


def _same(a: float, b: float) -> bool:
    return np.float64(a).tobytes() == np.float64(b).tobytes() or bool(np.isnan(a) and np.isnan(b))


def _new_values(session: Session, run: Run, grouped: dict[str, tuple[list[int], list[float]]]
                ) -> dict[str, tuple[list[int], list[float]]]:
    """The points of a request that change what the run holds. Values an MLflow client logs at one step are a
    history, as MLflow keeps them: a different value at a step the run already holds is stored after the ones
    before it, and the step then reads it (its latest, ``metrics_repo._assemble``). A value equal to the step's
    latest one (a client re-sending a point, or the same value logged again) changes neither and is not stored."""
    stored = metrics_repo.stored_points(session, run.id, run.attempt,
                                        {key: (min(s), max(s)) for key, (s, _) in grouped.items()})
    out: dict[str, tuple[list[int], list[float]]] = {}
    for key, (steps, values) in grouped.items():
        held_steps, held_values = stored.get(key, ((), ()))
        latest = {int(s): float(v) for s, v in zip(held_steps, held_values)}
        keep: tuple[list[int], list[float]] = ([], [])
        for step, value in zip(steps, values):
            if step in latest and _same(latest[step], value):
                continue
            latest[step] = value
            keep[0].append(step)
            keep[1].append(value)
        if keep[0]:
            out[key] = keep
    return out


def _too_large(message: str) -> MlflowError:
    return MlflowError(413, "RESOURCE_LIMIT_EXCEEDED", message)


def _check_record(run_id: int | None, params: dict[str, str], tags: dict[str, str]) -> None:
    """The per-run caps on MLflow params and tags (:data:`MAX_RUN_PARAMS`, :data:`MAX_RUN_TAGS`,
    :data:`MAX_RUN_PARAMS_TAGS_BYTES`), checked on what the run would hold after the write, so a
    refused write changes nothing and a re-sent one (same keys, same values) still passes."""
    which = f"run {run_id}" if run_id is not None else "a run"
    if len(params) > MAX_RUN_PARAMS:
        raise _too_large(f"{which} would hold {len(params)} params; the limit is {MAX_RUN_PARAMS} per run")
    if len(tags) > MAX_RUN_TAGS:
        raise _too_large(f"{which} would hold {len(tags)} tags; the limit is {MAX_RUN_TAGS} per run")
    size = sum(len(k.encode()) + len(v.encode()) for d in (params, tags) for k, v in d.items())
    if size > MAX_RUN_PARAMS_TAGS_BYTES:
        raise _too_large(f"{which}'s params and tags would take {size} bytes; the limit is "
                         f"{MAX_RUN_PARAMS_TAGS_BYTES} bytes per run (keys and values, UTF-8)")


def _set_params(run: Run, params: list[ParamIn]) -> None:
    if not params:
        return
    meta = _meta(run)
    current = dict(meta.get("params") or {})
    for p in params:
        if p.key in current and current[p.key] != p.value:
            raise _invalid(f"param {p.key!r} of run {run.id} is already {current[p.key]!r}; params cannot change "
                           f"(got {p.value!r})")
        current[p.key] = p.value
    _check_record(run.id, current, dict(meta.get("tags") or {}))
    meta["params"] = current
    run.mlflow = meta


def _set_tags(run: Run, tags: list[TagIn]) -> None:
    if not tags:
        return
    meta = _meta(run)
    current = dict(meta.get("tags") or {})
    for t in tags:
        current[t.key] = t.value
        if t.key == RUN_NAME_TAG:
            meta["run_name"] = t.value
    _check_record(run.id, dict(meta.get("params") or {}), current)
    meta["tags"] = current
    run.mlflow = meta


def log_batch(session: Session, body: LogBatchIn, caller: MlflowCaller, settings: Settings) -> None:
    run = _run_for_write(session, int(body.run_id), caller)
    _set_params(run, body.params)
    _set_tags(run, body.tags)
    _store_metrics(session, run, body.metrics, settings)
    session.flush()


def log_batch_parts(session: Session, run_id: int, caller: MlflowCaller, settings: Settings, *,
                    metrics: Sequence[MetricIn] = (), params: Sequence[ParamIn] = (),
                    tags: Sequence[TagIn] = ()) -> None:
    run = _run_for_write(session, run_id, caller)
    _set_params(run, list(params))
    _set_tags(run, list(tags))
    _store_metrics(session, run, list(metrics), settings)
    session.flush()


def get_run(session: Session, run_id: int, caller: MlflowCaller) -> dict[str, Any]:
    return run_view(session, _run_for_read(session, run_id, caller))


def _int_param(params: dict[str, str], name: str, default: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _invalid(f"param {name!r} must be an integer to place the run in the study, got {raw!r}") from None
    if value < 0:
        raise _invalid(f"param {name!r} must be >= 0, got {value}")
    return value


def update_run(session: Session, body: UpdateRunIn, caller: MlflowCaller) -> dict[str, Any]:
    run_id = int(body.run_id or body.run_uuid or 0)
    run = _run_for_write(session, run_id, caller)
    meta = _meta(run)
    if body.run_name:
        meta["run_name"] = body.run_name
    if body.status:
        meta["status"] = body.status
    run.mlflow = meta
    if caller.run is None and body.status in ("FINISHED", "FAILED", "KILLED"):
        _finish_external(session, run, body.status)
    session.flush()
    return run_info(run)


def _finish_external(session: Session, run: Run, status: str) -> None:
    params = dict(_meta(run).get("params") or {})
    run.seed = _int_param(params, "seed", run.seed)
    run.repeat = _int_param(params, "repeat", run.repeat)
    level = params.get("determinism")
    if level is not None:
        if level not in {d.value for d in Determinism}:
            raise _invalid(f"param 'determinism' must be one of {[d.value for d in Determinism]}, got {level!r}")
        run.determinism = level
    series = metrics_repo.load_series(session, [run.id], None)
    run.final_metrics = {key: wire_float(float(values[-1])) for (_, key), (steps, values) in series.items() if len(steps)}
    run.status = RunStatus.completed.value if status == "FINISHED" else RunStatus.failed.value
    if status != "FINISHED":
        run.failure_kind = "error"
        run.error = f"the MLflow client ended the run as {status}"
    run.finished_at = utcnow()
    study = session.get(Study, run.study_id)
    if study is not None:
        study.updated_at = utcnow()


def create_run(session: Session, body: CreateRunIn, caller: MlflowCaller) -> dict[str, Any]:
    principal = _user(caller, "runs/create")
    study = session.get(Study, int(body.experiment_id))
    if study is None:
        raise _not_found(f"experiment {body.experiment_id} not found")
    if study.kind != "external":
        raise _invalid(f"experiment {study.id} is managed study {study.name!r}: its runs come from workers. "
                       "Log runs from elsewhere into an external study (experiments/create makes one)")
    ensure_may_change(principal, study.owner_token_id, f"study {study.id}")
    tags = {t.key: t.value for t in body.tags}
    name = body.run_name or tags.get(RUN_NAME_TAG)
    now = utcnow()
    run = Run(study_id=study.id, seed=0, repeat=0, determinism=Determinism.seeded.value, stack="mlflow",
              framework="external", required_labels=[], status=RunStatus.running.value, attempt=1, max_attempts=1,
              fingerprint={}, digests={}, started_at=now, mlflow={"params": {}, "tags": tags, "run_name": name})
    session.add(run)
    study.updated_at = now
    session.flush()
    return run_view(session, run)


# --- experiments -------------------------------------------------------------------------------


def _study_id(experiment_id: str) -> int:
    """An experiment id as a study id: ASCII digits ("²" is a digit to str.isdigit, not to int()),
    a bigint at most (a longer number names no study rather than overflowing the query)."""
    if not (experiment_id.isascii() and experiment_id.isdigit()):
        raise _invalid(f"experiment_id must be a study id (digits), got {experiment_id!r}")
    if int(experiment_id) > 2**63 - 1:
        raise _not_found(f"experiment {experiment_id} not found")
    return int(experiment_id)


def get_experiment(session: Session, experiment_id: str, caller: MlflowCaller) -> dict[str, Any]:
    study_id = _study_id(experiment_id)
    if caller.run is not None and caller.run.study_id != study_id:
        raise _denied(f"this run credential belongs to experiment {caller.run.study_id}")
    study = session.get(Study, study_id)
    if study is None:
        raise _not_found(f"experiment {experiment_id} not found")
    return experiment_view(study)


def get_experiment_by_name(session: Session, name: str, caller: MlflowCaller) -> dict[str, Any]:
    """The study of that name the caller may log runs into, so ``mlflow.set_experiment`` finds it
    or, when there is none, creates the caller's own: a run credential finds its run's study;
    a user only their own external studies (another user's study of that name would answer 403
    at ``start_run``); an admin any external study, their own first."""
    stmt = select(Study).where(Study.name == name).order_by(Study.id.desc())
    principal = caller.principal
    if caller.run is not None:
        stmt = stmt.where(Study.id == caller.run.study_id)
    elif principal is not None:
        stmt = stmt.where(Study.kind == "external")
        if principal.role is not Role.admin:
            stmt = stmt.where(Study.owner_token_id == principal.token_id)
    candidates = list(session.scalars(stmt.limit(50)))
    if principal is not None:
        candidates.sort(key=lambda s: s.owner_token_id != principal.token_id)
    if not candidates:
        raise _not_found(f"experiment {name!r} does not exist")
    return experiment_view(candidates[0])


def create_experiment(session: WriteSession, body: CreateExperimentIn, caller: MlflowCaller, settings: Settings) -> str:
    principal = _user(caller, "experiments/create")
    existing = session.scalars(select(Study.id).where(Study.name == body.name, Study.kind == "external",
                                                      Study.owner_token_id == principal.token_id)).first()
    if existing is not None:
        raise MlflowError(400, "RESOURCE_ALREADY_EXISTS", f"experiment {body.name!r} already exists (study {existing})")
    spec = StudySpec(name=body.name, kind="external", description="created by an MLflow client")
    study = studies.create_study(session, spec, settings, principal)
    return str(study.id)
