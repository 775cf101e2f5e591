"""SQL on runs: the run state machine's conditional UPDATEs and every query other domains make on
runs. Queries take any session; the statements that change rows take a ``WriteSession``."""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import CursorResult, and_, bindparam, case, cast, exists, func, select, text, union, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session, aliased
from sqlalchemy.sql.elements import BindParameter

from steady.server.kit.db import WriteSession
from steady.server.kit.errors import NotFound
from steady.server.metrics import repository as metrics_repo
from steady.server.models import MetricChunk, Run, Study, Worker
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


def held_by(run_id: int, lease_id: str, token_id: int, now: datetime) -> tuple[Any, ...]:
    """WHERE clauses: the run is running under this live lease, and its worker is the caller token's (the
    holder's own row, by primary key: one lookup however many workers share the token)."""
    return (
        Run.id == run_id,
        Run.status == RunStatus.running.value,
        Run.lease_id == lease_id,
        Run.lease_expires_at.is_(None) | (Run.lease_expires_at >= now),
        select(Worker.id).where(Worker.id == Run.worker_id, Worker.token_id == token_id).exists(),
    )


def transition_held(session: WriteSession, run_id: int, lease_id: str, token_id: int, now: datetime,
                    values: Mapping[str, Any], returning: Sequence[Any]) -> Any | None:
    """``transition`` without reading the run first: the holder is the run's worker when that worker's token is
    ``token_id``, checked in the UPDATE's WHERE. The ``returning`` row, or None when the row did not match (the
    caller then reads the run to tell why)."""
    stmt = (
        update(Run)
        .where(*held_by(run_id, lease_id, token_id, now))
        .values(**values)
        .returning(*returning)
        .execution_options(synchronize_session=False)
    )
    return session.execute(stmt).first()


def study_activity(session: Session, study_id: int) -> tuple[bool, bool, bool]:
    """Whether the study has a queued run, a running run, a completed or failed run: three index probes
    (runs.study_id, runs.status), however many runs the study has."""
    def any_in(*statuses: str) -> Any:
        return exists().where(Run.study_id == study_id, Run.status.in_(statuses))
    row = session.execute(select(any_in(RunStatus.queued.value), any_in(RunStatus.running.value),
                                 any_in(RunStatus.completed.value, RunStatus.failed.value))).one()
    return bool(row[0]), bool(row[1]), bool(row[2])


def pick_queued(session: WriteSession, worker_id: int, labels: Collection[str], *, study_id: int | None, limit: int,
                max_held: int, builtin_only: bool, quarantined: bool) -> Any | None:
    """The queued run this worker leases next, locked, in one statement: (run id, study id, study spec, study
    status), or None when there is none (or the worker already holds ``max_held`` runs).

    The candidates are the runs pinned to the worker (first, in id order) and the first ``limit`` queued runs
    it may take by id; among the latter, runs of a block the worker already ran part of come first, then
    blocks no worker started, then blocks another worker started. A block is (study, seed, repeat, stack): one
    run per determinism level, created next to each other (``studies.service.create_study``); kept on one
    worker, its runs can be compared paired for the cost of determinism (``steady.server.stats.cost``). A
    preference only: a worker still takes another worker's block when nothing else is queued. A candidate
    needs the worker's labels, a built-in workload with ``builtin_only``, and a study that lets quarantined
    workers in when the worker is quarantined (``alerts.quarantine.respects``, the same rule in SQL). On
    PostgreSQL the chosen row is locked FOR UPDATE SKIP LOCKED: a run another leaser holds right now is passed
    over for the next. SQLite has one writer at a time (the transaction began IMMEDIATE), so the read needs
    no lock."""
    postgres = session.get_bind().dialect.name == "postgresql"
    stmt = _pick_statement(postgres, limit, study_id is not None, builtin_only, quarantined)
    params: dict[str, Any] = {"worker_id": worker_id, "labels": list(labels), "max_held": max_held}
    if study_id is not None:
        params["study_id"] = study_id
    return session.execute(stmt, params).first()


@functools.cache
def _pick_statement(postgres: bool, limit: int, one_study: bool, builtin_only: bool, quarantined: bool) -> Any:
    """``pick_queued``'s statement for one combination of its options, built once: its parameters (worker,
    labels, cap, study) are bound at each lease, so a lease neither builds the query nor computes its cache
    key again (building it, with its aliased blocks, was a third of the CPU of a lease on PostgreSQL)."""
    worker_id: BindParameter[int] = bindparam("worker_id")
    mine_or_free = Run.pinned_worker.is_(None) | (Run.pinned_worker == worker_id)
    queued = Run.status == RunStatus.queued.value
    pinned = select(Run.id, Run.status).where(Run.pinned_worker == worker_id, queued).order_by(Run.id).limit(limit)
    page = select(Run.id, Run.status).where(queued, mine_or_free).order_by(Run.id).limit(limit)
    if one_study:
        study_id: BindParameter[int] = bindparam("study_id")
        pinned, page = pinned.where(Run.study_id == study_id), page.where(Run.study_id == study_id)
    pinned_q, page_q = pinned.subquery(), page.subquery()
    # The candidates drive the query: at most 2 × ``limit`` runs, each joined to its row by primary key, so a
    # lease costs the same however long the queue. MATERIALIZED keeps them one computed list, and the outer
    # query names no condition an index of runs could answer on its own (its status is compared with the
    # candidate's, which is 'queued'): PostgreSQL's planner, misjudging how many runs are queued, would
    # otherwise walk every queued run and compare each with every candidate (the queue's length times the
    # page per lease). A candidate's pin never changes, so it is not checked again here; its status is, on the
    # row as it is when locked.
    candidates = union(select(pinned_q.c.id, pinned_q.c.status), select(page_q.c.id, page_q.c.status)) \
        .cte("candidates").prefix_with("MATERIALIZED")
    block = aliased(Run)
    same_block = and_(block.study_id == Run.study_id, block.seed == Run.seed, block.repeat == Run.repeat,
                      block.stack == Run.stack, block.status != RunStatus.queued.value)
    # "some worker took it" as an expression no index answers (worker ids start at 1): the block is found
    # through (study_id, seed), however the planner's statistics judge workers (right after a study is queued
    # they say no run has one, and a probe through the worker index then reads every leased run per candidate)
    leased = func.coalesce(block.worker_id, 0) != 0
    rank = case(
        (Run.pinned_worker.is_not(None), 0),
        (select(block.id).where(same_block, block.worker_id == worker_id).exists(), 0),
        (select(block.id).where(same_block, leased).exists(), 2),
        else_=1,
    )
    if postgres:
        has_labels = cast(Run.required_labels, JSONB).contained_by(bindparam("labels", type_=JSONB))
    else:
        required = func.json_each(Run.required_labels).table_valued("value")
        has_labels = ~select(required.c.value).where(required.c.value.not_in(bindparam("labels", expanding=True))).exists()
    held = select(func.count()).select_from(Run).where(Run.worker_id == worker_id,
                                                       Run.status == RunStatus.running.value).scalar_subquery()
    stmt = (
        select(Run.id, Run.study_id, Study.spec, Study.status)
        .select_from(candidates)
        .join(Run, and_(Run.id == candidates.c.id, Run.status == candidates.c.status))
        .join(Study, Study.id == Run.study_id)
        .where(has_labels, held < bindparam("max_held"))
        .order_by(Run.pinned_worker.is_(None), rank, Run.id)
        .limit(1)
    )
    if builtin_only:  # steady.server.lifecycle.leasing._is_user_code, negated
        stmt = stmt.where(func.coalesce(Study.spec["workload"]["name"].as_string(), "") != "")
    if quarantined:  # not quarantine.respects(spec): respect_quarantine, else no fleet section
        respect = Study.spec["respect_quarantine"].as_boolean()
        stmt = stmt.where(~case((respect.is_(None), Study.spec["fleet"].as_string().is_(None)), else_=respect))
    if postgres:
        stmt = stmt.with_for_update(of=Run, skip_locked=True)
    return stmt


def claim_returning(session: WriteSession, run_id: int, values: Mapping[str, Any]) -> Run | None:
    """``queued → running`` for a run ``pick_queued`` chose: the run as the UPDATE left it (RETURNING), or None
    if it is no longer queued."""
    return session.scalars(
        update(Run).where(Run.id == run_id, Run.status == RunStatus.queued.value).values(**values)
        .returning(Run).execution_options(synchronize_session=False, populate_existing=True)
    ).first()


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


# Runs queued at once from which PostgreSQL's statistics of the runs table are refreshed in the same transaction.
ANALYZE_AFTER_RUNS = 100


def insert_runs(session: WriteSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Queue many runs in one statement (a study's matrix, an adaptive stage's seeds).

    On PostgreSQL, ``ANALYZE runs`` follows a large insert: the study's runs are leased right away, and until
    autovacuum comes by (a minute or more) the planner would choose the lease's query plan from statistics
    that predate them (on a new database: none, where every index of runs looks as good as another and a
    lease may scan the whole study for each candidate)."""
    session.execute(Run.__table__.insert(), list(rows))
    if len(rows) >= ANALYZE_AFTER_RUNS and session.get_bind().dialect.name == "postgresql":
        session.execute(text("ANALYZE runs"))


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
    known: frozenset[str]  # the batch's keys among them
    seq_stored: bool  # this batch seq is already stored for the current attempt (a retry)

    @property
    def known_keys(self) -> int:
        """How many of the batch's keys the attempt already holds."""
        return len(self.known)


@functools.lru_cache(maxsize=64)
def _batch_context_statement(n_keys: int):
    """The run's row (its usage is kept there: runs.stored_points, runs.stored_keys), its holder, and a lookup
    per batch key and for the seq in the attempt's chunks: the same work however many chunks the attempt holds.
    Built once per number of keys: the hot path of ingestion then skips building the statement and its cache key."""
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
            runs.c.stored_points,
            runs.c.stored_keys,
            exists().where(current, chunks.c.seq == bindparam("seq")),
            *(exists().where(current, chunks.c.key == bindparam(f"key_{i}")) for i in range(n_keys)),
        )
        .select_from(runs.outerjoin(workers, workers.c.id == runs.c.worker_id))
        .where(runs.c.id == bindparam("run_id"))
    )


def batch_context(session: Session, run_id: int, seq: int, keys: Collection[str]) -> BatchContext | None:
    """Everything ``ingest_batch`` checks before it inserts, in one statement (None: no such run). On
    PostgreSQL the run's row is locked first, until commit, so the usage read here is the one the insert adds
    to, and two batches of one attempt stored at once by two processes do not both count a key new to it. The
    lock is a statement of its own: under read committed the next statement's snapshot sees the chunks of the
    transaction the lock waited for; a FOR UPDATE in this statement would look them up as they were before."""
    metrics_repo.lock_usage(session, run_id)
    distinct_keys = list(dict.fromkeys(keys))
    params = {"run_id": run_id, "seq": seq, **{f"key_{i}": k for i, k in enumerate(distinct_keys)}}
    row = session.connection().execute(_batch_context_statement(len(distinct_keys)), params).first()
    if row is None:
        return None
    return BatchContext(
        run_id=row[0], status=row[1], lease_id=row[2], lease_expires_at=row[3], attempt=row[4],
        holder_token_id=row[5], stored_points=int(row[6] or 0), stored_keys=int(row[7] or 0),
        known=frozenset(k for k, held in zip(distinct_keys, row[9:]) if held), seq_stored=bool(row[8]),
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
