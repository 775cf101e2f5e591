"""SQL on runs: the run state machine's conditional UPDATEs and every query other domains make on
runs. Queries take any session; the statements that change rows take a ``WriteSession``."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import CursorResult, and_, bindparam, distinct, exists, func, select, update
from sqlalchemy.orm import Session

from steady.server.kit.db import WriteSession
from steady.server.kit.errors import NotFound
from steady.server.models import MetricChunk, Run, Worker
from steady.server.runs.conflicts import merged
from steady.worker.contract.protocol import RunStatus


def _rowcount(result: Any) -> int:
    """Rows an UPDATE matched (an UPDATE's result is a ``CursorResult``)."""
    assert isinstance(result, CursorResult)
    return result.rowcount


def find_run(session: Session, run_id: int, *, lock: bool = False) -> Run | None:
    """The run, or None; ``lock``: FOR UPDATE (a write that reads the run first)."""
    if lock:
        return session.scalars(select(Run).where(Run.id == run_id).with_for_update()).first()
    return session.get(Run, run_id)


def get_run(session: Session, run_id: int) -> Run:
    run = find_run(session, run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    return run


@dataclass(frozen=True)
class RunState:
    """What a state transition checks before its conditional UPDATE (read without a lock)."""

    run_id: int
    study_id: int
    status: str
    attempt: int
    lease_id: str | None
    lease_expires_at: datetime | None
    worker_id: int | None
    holder_token_id: int | None  # the token of the worker the run is leased to
    cancel_requested: bool
    transition_request_id: str | None
    transition_status: str | None


def run_state(session: Session, run_id: int) -> RunState | None:
    row = session.execute(
        select(Run.id, Run.study_id, Run.status, Run.attempt, Run.lease_id, Run.lease_expires_at, Run.worker_id,
               Worker.token_id, Run.cancel_requested, Run.transition_request_id, Run.transition_status)
        .select_from(Run)
        .outerjoin(Worker, Worker.id == Run.worker_id)
        .where(Run.id == run_id)
    ).first()
    return None if row is None else RunState(*row)


def transition(session: WriteSession, state: RunState, lease_id: str, now: datetime,
               values: Mapping[str, Any], returning: Sequence[Any] = ()) -> Any | None:
    """``UPDATE runs SET values WHERE id = :id AND status = 'running' AND lease_id = :lease_id AND
    worker_id = :holder AND lease_expires_at >= :now``: the transition of the run leased under
    ``lease_id`` by the worker ``state`` names, applied only if the lease is still live.

    True (or the ``returning`` row) when it was applied, None when another transition won the
    race since ``state`` was read (the row no longer matches).
    """
    stmt = (
        update(Run)
        .where(
            Run.id == state.run_id,
            Run.status == RunStatus.running.value,
            Run.lease_id == lease_id,
            Run.worker_id.is_(None) if state.worker_id is None else Run.worker_id == state.worker_id,
            Run.lease_expires_at.is_(None) | (Run.lease_expires_at >= now),
        )
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if returning:
        return session.execute(stmt.returning(*returning)).first()
    return True if _rowcount(session.execute(stmt)) == 1 else None


def claim(session: WriteSession, run_id: int, values: Mapping[str, Any], *, worker_id: int | None = None) -> bool:
    """``queued → running``: succeeds for exactly one of any number of concurrent callers; with ``worker_id``
    only if the run is unpinned or pinned to that worker."""
    stmt = update(Run).where(Run.id == run_id, Run.status == RunStatus.queued.value)
    if worker_id is not None:
        stmt = stmt.where(Run.pinned_worker.is_(None) | (Run.pinned_worker == worker_id))
    result = session.execute(
        stmt.values(**values)
        .execution_options(synchronize_session=False)
    )
    return _rowcount(result) == 1


def lockable_queued(session: Session, run_id: int) -> bool:
    """Lock the queued run unless another leaser holds it right now (SKIP LOCKED; SQLite: no-op)."""
    stmt = (
        select(Run.id)
        .where(Run.id == run_id, Run.status == RunStatus.queued.value)
        .with_for_update(skip_locked=True)
    )
    return session.execute(stmt).first() is not None


def queued_candidates(session: Session, study_id: int | None, limit: int, *, worker_id: int | None = None) -> list:
    """Queued runs in id order (read without locks): id, required labels, study, seed, repeat, stack.

    With ``worker_id``, only runs that worker may take: unpinned ones and those pinned to it (a run pinned
    to another worker is never a candidate, so pinned runs of other workers cannot fill the page)."""
    stmt = (
        select(Run.id, Run.required_labels, Run.study_id, Run.seed, Run.repeat, Run.stack)
        .where(Run.status == RunStatus.queued.value)
        .order_by(Run.id)
        .limit(limit)
    )
    if worker_id is not None:
        stmt = stmt.where(Run.pinned_worker.is_(None) | (Run.pinned_worker == worker_id))
    if study_id is not None:
        stmt = stmt.where(Run.study_id == study_id)
    return list(session.execute(stmt).all())


def queued_pinned_to(session: Session, worker_id: int, study_id: int | None, limit: int) -> list:
    """Queued runs pinned to this worker, in id order, with the columns of ``queued_candidates`` (by the
    index on pinned_worker and status: a few rows, however long the queue)."""
    stmt = (
        select(Run.id, Run.required_labels, Run.study_id, Run.seed, Run.repeat, Run.stack)
        .where(Run.pinned_worker == worker_id, Run.status == RunStatus.queued.value)
        .order_by(Run.id)
        .limit(limit)
    )
    if study_id is not None:
        stmt = stmt.where(Run.study_id == study_id)
    return list(session.execute(stmt).all())


def started_block_workers(session: Session, study_ids: Collection[int], seeds: Collection[int]) -> list:
    """(study, seed, repeat, stack, worker) of every run of those studies and seeds a worker took."""
    return list(session.execute(
        select(Run.study_id, Run.seed, Run.repeat, Run.stack, Run.worker_id).where(
            Run.study_id.in_(set(study_ids)),
            Run.seed.in_(set(seeds)),
            Run.status != RunStatus.queued.value,
            Run.worker_id.is_not(None),
        )
    ).all())


def running_count(session: Session, *, study_id: int | None = None, worker_id: int | None = None) -> int:
    """Runs running (on any worker, or on ``worker_id``), in one study or the whole queue."""
    stmt = select(func.count()).select_from(Run).where(Run.status == RunStatus.running.value)
    if study_id is not None:
        stmt = stmt.where(Run.study_id == study_id)
    if worker_id is not None:
        stmt = stmt.where(Run.worker_id == worker_id)
    return int(session.scalar(stmt) or 0)


def running_by_worker(session: Session) -> dict[int, list[int]]:
    """The runs each worker is running now."""
    running: dict[int, list[int]] = {}
    for run_id, worker_id in session.execute(
        select(Run.id, Run.worker_id)
        .where(Run.status == RunStatus.running.value, Run.worker_id.is_not(None))
        .order_by(Run.id)
    ):
        if worker_id is not None:
            running.setdefault(worker_id, []).append(run_id)
    return running


def status_counts(session: Session, study_ids: Sequence[int] | None) -> list[tuple[int, str, int]]:
    """(study, status, runs) for each status the studies' (None: all studies') runs are in."""
    stmt = select(Run.study_id, Run.status, func.count()).group_by(Run.study_id, Run.status)
    if study_ids is not None:
        if not study_ids:
            return []
        stmt = stmt.where(Run.study_id.in_(list(study_ids)))
    return [(sid, status, int(n)) for sid, status, n in session.execute(stmt)]


def list_runs(
    session: Session, study_id: int, *, status: str | None, limit: int, offset: int
) -> tuple[list[Run], int]:
    stmt = select(Run).where(Run.study_id == study_id)
    if status:
        stmt = stmt.where(Run.status == status)
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    rows = session.scalars(stmt.order_by(Run.id).limit(limit).offset(offset))
    return list(rows), total


def first_failed_run(session: Session, study_id: int) -> Run | None:
    stmt = (
        select(Run)
        .where(Run.study_id == study_id, Run.status == RunStatus.failed.value)
        .order_by(Run.finished_at, Run.id)
        .limit(1)
    )
    return session.scalars(stmt).first()


def last_run_with_output(session: Session, study_id: int) -> Run | None:
    """The study's finished run that last kept some output (``stderr_tail``)."""
    stmt = (
        select(Run)
        .where(Run.study_id == study_id, Run.stderr_tail.is_not(None), Run.stderr_tail != "")
        .order_by(Run.finished_at.desc(), Run.id.desc())
        .limit(1)
    )
    return session.scalars(stmt).first()


def unclaimed_pins(session: Session, condition: Any) -> list:
    """(id, study_id, pinned_worker, pinned_until) of the runs matching ``condition`` (the reaper's pins)."""
    return list(session.execute(
        select(Run.id, Run.study_id, Run.pinned_worker, Run.pinned_until).where(condition).order_by(Run.id)
    ).all())


def studies_of_runs(session: Session, condition: Any) -> set[int]:
    return set(session.scalars(select(Run.study_id).where(condition)))


def insert_runs(session: WriteSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Queue many runs in one statement (a study's matrix, an adaptive stage's seeds)."""
    session.execute(Run.__table__.insert(), list(rows))


def cancel_runs_of(session: WriteSession, study_id: int, now: datetime) -> None:
    """A study's cancellation: its queued runs end cancelled; its running ones are asked to stop
    (the next heartbeat answers ``cancel``, and the run ends cancelled when its worker gives up)."""
    update_where(session, and_(Run.study_id == study_id, Run.status == RunStatus.queued.value),
                 {"status": RunStatus.cancelled.value, "finished_at": now, "error": "study cancelled"})
    update_where(session, and_(Run.study_id == study_id, Run.status == RunStatus.running.value),
                 {"cancel_requested": True})


def update_where(session: WriteSession, condition: Any, values: Mapping[str, Any]) -> int:
    """One multi-row UPDATE (the reaper, a study's cancellation); the rows it changed."""
    return _rowcount(session.execute(update(Run).where(condition).values(**values)))


@dataclass(frozen=True)
class BatchContext:
    """A run's lease state and its current attempt's usage, as one metric batch needs them."""

    run_id: int
    status: str
    lease_id: str | None
    lease_expires_at: datetime | None
    attempt: int
    holder_token_id: int | None  # the token of the worker the run is leased to
    stored_points: int  # points stored for the current attempt
    stored_keys: int  # distinct keys stored for the current attempt
    known_keys: int  # how many of the batch's keys are among them
    seq_stored: bool  # this batch seq is already stored for the current attempt (a retry)


def _batch_context_statement():
    chunks, runs, workers = MetricChunk.__table__, Run.__table__, Worker.__table__
    current = and_(chunks.c.run_id == runs.c.id, chunks.c.attempt == runs.c.attempt)
    return (
        select(
            runs.c.id,
            runs.c.status,
            runs.c.lease_id,
            runs.c.lease_expires_at,
            runs.c.attempt,
            workers.c.token_id,
            select(func.coalesce(func.sum(chunks.c.n), 0)).where(current).scalar_subquery(),
            select(func.count(distinct(chunks.c.key))).where(current).scalar_subquery(),
            select(func.count(distinct(chunks.c.key)))
            .where(current, chunks.c.key.in_(bindparam("keys", expanding=True)))
            .scalar_subquery(),
            exists().where(current, chunks.c.seq == bindparam("seq")),
        )
        .select_from(runs.outerjoin(workers, workers.c.id == runs.c.worker_id))
        .where(runs.c.id == bindparam("run_id"))
    )


# Built once: the hot path of ingestion then skips building the statement and its cache key.
_BATCH_CONTEXT = _batch_context_statement()


def batch_context(session: Session, run_id: int, seq: int, keys: Collection[str]) -> BatchContext | None:
    """Everything ``ingest_batch`` checks before it inserts, in one round trip (None: no such run)."""
    row = session.connection().execute(_BATCH_CONTEXT, {"run_id": run_id, "seq": seq, "keys": list(keys)}).first()
    if row is None:
        return None
    return BatchContext(
        run_id=row[0], status=row[1], lease_id=row[2], lease_expires_at=row[3], attempt=row[4],
        holder_token_id=row[5], stored_points=int(row[6] or 0), stored_keys=int(row[7] or 0),
        known_keys=int(row[8] or 0), seq_stored=bool(row[9]),
    )


def runs_by_id(session: Session, run_ids: Collection[int]) -> dict[int, Run]:
    if not run_ids:
        return {}
    return {r.id: r for r in session.scalars(select(Run).where(Run.id.in_(list(run_ids))))}


def group_runs(session: Session, study_id: int, determinism: str, stack: str, statuses: Collection[str]) -> list[Run]:
    """The study's runs of one (determinism, stack) group in those statuses, excluded runs left out."""
    return list(session.scalars(
        select(Run).where(Run.study_id == study_id, Run.determinism == determinism, Run.stack == stack,
                          Run.status.in_(list(statuses)), Run.excluded_at.is_(None)).order_by(Run.id)
    ))


def groups_with_runs(session: Session, study_id: int) -> list[tuple[str, str]]:
    """The (determinism, stack) pairs the study has runs of, unordered."""
    stmt = select(Run.determinism, Run.stack).where(Run.study_id == study_id).distinct()
    return [(d, s) for d, s in session.execute(stmt).all()]


def last_changes(session: Session, study_ids: Sequence[int]) -> tuple[dict[int, Any], dict[int, Any]]:
    """Per study: its runs' latest finish time, and the id of its latest metric chunk."""
    finished = dict(session.execute(
        select(Run.study_id, func.max(Run.finished_at)).where(Run.study_id.in_(study_ids)).group_by(Run.study_id)
    ).all())
    chunks = dict(session.execute(
        select(Run.study_id, func.max(MetricChunk.id))
        .join(MetricChunk, MetricChunk.run_id == Run.id)
        .where(Run.study_id.in_(study_ids))
        .group_by(Run.study_id)
    ).all())
    return finished, chunks


def judged_runs(session: Session, study_id: int) -> list[Run]:
    """The runs a study's report judges: completed and not excluded by a person."""
    stmt = select(Run).where(
        Run.study_id == study_id, Run.status == RunStatus.completed.value, Run.excluded_at.is_(None)
    ).order_by(Run.id)
    return list(session.scalars(stmt))


def excluded_runs(session: Session, study_id: int) -> list[Run]:
    stmt = select(Run).where(Run.study_id == study_id, Run.excluded_at.is_not(None)).order_by(Run.id)
    return list(session.scalars(stmt))


def judged_final_metrics(session: Session, study_ids: Sequence[int]) -> list[tuple[int, str, str, dict[str, Any]]]:
    """(study_id, stack, determinism, final_metrics) of the judged runs of the studies."""
    if not study_ids:
        return []
    stmt = select(Run.study_id, Run.stack, Run.determinism, Run.final_metrics).where(
        Run.study_id.in_(list(study_ids)), Run.status == RunStatus.completed.value, Run.excluded_at.is_(None)
    )
    return [(sid, stack, det, finals) for sid, stack, det, finals in session.execute(stmt)]


def stacks_of(session: Session, study_id: int) -> list[str]:
    return list(session.scalars(select(Run.stack).where(Run.study_id == study_id).distinct()))


def status_totals(session: Session) -> dict[str, int]:
    """Runs per status over every study."""
    return {s: int(c) for s, c in session.execute(select(Run.status, func.count()).group_by(Run.status))}


def last_finished_at(session: Session, study_id: int) -> datetime | None:
    return session.scalar(select(func.max(Run.finished_at)).where(Run.study_id == study_id))


def add_conflicts(session: Session, run_id: int, conflicts: dict[str, Any] | None) -> None:
    """Add capture conflicts to those the run holds (the worker's with its result, the MLflow endpoint's
    as they are written): counted in all, the first ones kept in full."""
    if not conflicts or not conflicts.get("count"):
        return
    current = session.scalar(select(Run.metric_conflicts).where(Run.id == run_id))
    session.execute(update(Run).where(Run.id == run_id).values(metric_conflicts=merged(current, conflicts)))
