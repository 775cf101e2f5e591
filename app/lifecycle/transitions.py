"""The worker's transitions of a leased run: heartbeat, complete, fail, release.

Each is one conditional UPDATE (``runs_repo.transition``): ``WHERE id = :id AND status =
'running' AND lease_id = :lease AND worker_id = :holder AND the lease is live``, never a
read-modify-write. The state read first only chooses the answer (a repeated request's original
acknowledgement, or why the lease is not the caller's); when another transition changes the run
in between (the reaper re-queued it, a concurrent complete or fail won), the UPDATE matches no
row and the caller gets 409, so exactly one of any number of racing transitions takes effect.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import case, select, text, update

from steady.server.kit.auth import Role
from steady.server.kit.config import Settings
from steady.server.kit.db import WriteSession
from steady.server.kit.deps import Principal
from steady.server.kit.errors import Conflict, Forbidden, NotFound
from steady.server.metrics import repository as metrics_repo
from steady.server.kit.wire import wire_float
from steady.server.models import Run, Worker, utcnow
from steady.server.runs import repository as runs_repo
from steady.server.runs import settled
from steady.server.runs.repository import RunState
from steady.worker.contract.protocol import (
    ErrorCode,
    FailureKind,
    Heartbeat,
    HeartbeatAck,
    MetricConflicts,
    RunAck,
    RunFailure,
    RunRelease,
    RunResult,
    RunStatus,
)


def _finished(run_id: int, status: str) -> Conflict:
    return Conflict(f"run {run_id} is already {status}; nothing was changed", code=ErrorCode.already_finished.value)


def _lost(run_id: int) -> Conflict:
    return Conflict(
        f"lease lost: run {run_id} is no longer leased under this lease (it was re-queued or taken over)",
        code=ErrorCode.lease_lost.value,
    )


def verify_lease(run_id: int, status: str, run_lease_id: str | None, lease_expires_at: datetime | None,
                 holder_token_id: Callable[[], int | None], lease_id: str, principal: Principal) -> None:
    """Raise unless ``lease_id`` is the run's live lease and the caller's token is the leasing worker's."""
    if status in RunStatus.TERMINAL and run_lease_id in (lease_id, None):
        raise _finished(run_id, status)
    if run_lease_id != lease_id or status != RunStatus.running:
        raise _lost(run_id)
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


def _leased_state(session: WriteSession, run_id: int, lease_id: str, principal: Principal,
                  state: RunState | None = None) -> RunState:
    """The run's state (``state`` if already read), if ``lease_id`` is its live lease and the
    caller's token is the leasing worker's."""
    state = state or runs_repo.run_state(session, run_id)
    if state is None:
        raise NotFound(f"run {run_id} not found")
    verify_lease(state.run_id, state.status, state.lease_id, state.lease_expires_at,
                 lambda: state.holder_token_id, lease_id, principal)
    return state


def _duplicate(state: RunState | None, request_id: str | None) -> RunAck | None:
    """The original acknowledgement, when this transition repeats the last one applied."""
    if (state is not None and request_id is not None and state.transition_request_id == request_id
            and state.transition_status):
        return RunAck(run_id=state.run_id, status=RunStatus(state.transition_status), duplicate=True)
    return None


def _lost_race(session: WriteSession, run_id: int, lease_id: str, request_id: str | None,
               principal: Principal) -> RunAck:
    """After a conditional UPDATE matched no row: the original ack if the winner was this very
    request (a retry racing its original), else the 409 that the run's new state calls for."""
    state = runs_repo.run_state(session, run_id)
    if (ack := _duplicate(state, request_id)) is not None:
        return ack
    if state is not None:
        verify_lease(state.run_id, state.status, state.lease_id, state.lease_expires_at,
                     lambda: state.holder_token_id, lease_id, principal)
    raise _lost(run_id)  # the run changed and changed back (re-queued, then leased again)


def _apply(session: WriteSession, run_id: int, lease_id: str, request_id: str | None, principal: Principal,
           values: dict[str, Any], now: datetime) -> tuple[int, int, str] | RunAck:
    """Check, then transition the leased run to ``values``: (its study, its attempt after the UPDATE, its new
    status), or the acknowledgement to answer instead (of an earlier identical request, or of the race's
    winner when that was this same request).

    A worker's transition of its own live lease is one conditional UPDATE (``runs_repo.transition_held``);
    only when that matches no row (or for an admin) is the run read, to answer a repeated request or say why."""
    values = {**values, "transition_request_id": request_id, "transition_status": values["status"]}
    returning = (Run.study_id, Run.attempt, Run.status)
    if principal.role is not Role.admin and principal.token_id is not None:
        row = runs_repo.transition_held(session, run_id, lease_id, principal.token_id, now, values, returning)
        if row is not None:
            return row[0], row[1], row[2]
    before = runs_repo.run_state(session, run_id)
    if (ack := _duplicate(before, request_id)) is not None:
        return ack
    state = _leased_state(session, run_id, lease_id, principal, before)
    row = runs_repo.transition(session, state, lease_id, now, values, returning=returning)
    if row is None:
        return _lost_race(session, run_id, lease_id, request_id, principal)
    return row[0], row[1], row[2]


def _extend_lease(session: WriteSession, run_id: int, lease_id: str, token_id: int, now: datetime,
                  values: dict[str, Any]) -> Any | None:
    """The heartbeat's write, one statement where the database allows: ``UPDATE runs SET values WHERE
    id = :id AND status = 'running' AND lease_id = :lease AND the lease is live AND worker_id is a
    worker of the caller's token RETURNING lease_expires_at, cancel_requested``, and the worker's
    ``last_seen_at`` in the same statement (PostgreSQL: a data-modifying CTE; SQLite, where the
    database is in the process: a second UPDATE). Core statements on the session's connection: no
    ORM objects, no read first. None when the row did not match."""
    beat = (
        update(Run)
        .where(*runs_repo.held_by(run_id, lease_id, token_id, now))
        .values(**values)
        .returning(Run.lease_expires_at, Run.cancel_requested, Run.worker_id)
    )
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        cte = beat.cte("beat")
        seen = update(Worker).where(Worker.id == cte.c.worker_id).values(last_seen_at=now).cte("seen")
        return conn.execute(select(cte.c.lease_expires_at, cte.c.cancel_requested).add_cte(seen)).first()
    row = conn.execute(beat).first()
    if row is not None:
        conn.execute(update(Worker).where(Worker.id == row[2]).values(last_seen_at=now))
    return row


_BEAT_MANY = text("""
WITH v AS (
  SELECT * FROM unnest(CAST(:ids AS BIGINT[]), CAST(:leases AS VARCHAR[]), CAST(:tokens AS BIGINT[]),
                       CAST(:steps AS BIGINT[])) AS v(id, lease_id, token_id, step)),
beat AS (
  UPDATE runs SET lease_expires_at = :expires, progress_step = COALESCE(v.step, runs.progress_step)
  FROM v
  WHERE runs.id = v.id AND runs.status = 'running' AND runs.lease_id = v.lease_id
    AND (runs.lease_expires_at IS NULL OR runs.lease_expires_at >= :now)
    AND EXISTS (SELECT 1 FROM workers WHERE workers.id = runs.worker_id AND workers.token_id = v.token_id)
  RETURNING runs.id, runs.lease_expires_at, runs.cancel_requested, runs.worker_id),
seen AS (UPDATE workers SET last_seen_at = :now FROM beat WHERE workers.id = beat.worker_id)
SELECT id, lease_expires_at, cancel_requested FROM beat
""")


def heartbeat_many(session: WriteSession, beats: list[tuple[int, Heartbeat, Principal]],
                   settings: Settings) -> list[HeartbeatAck | None]:
    """PostgreSQL: the heartbeats of different runs by worker tokens, in one statement (the UPDATE of
    ``_extend_lease`` joined to the heartbeats as four arrays, so the statement's text is the same
    for any number of them and the driver prepares it once). Each one's acknowledgement, or None
    where its row did not match (the caller then answers it with ``heartbeat``, which says why)."""
    now = utcnow()
    naive_now = now.astimezone(UTC).replace(tzinfo=None)  # the columns hold naive UTC (UTCDateTime)
    params: dict[str, Any] = {
        "now": naive_now, "expires": naive_now + timedelta(seconds=settings.lease_seconds),
        "ids": [run_id for run_id, _, _ in beats], "leases": [beat.lease_id for _, beat, _ in beats],
        "tokens": [principal.token_id for _, _, principal in beats], "steps": [beat.step for _, beat, _ in beats],
    }
    found = {row[0]: row for row in session.connection().execute(_BEAT_MANY, params)}
    out: list[HeartbeatAck | None] = []
    for run_id, _, _ in beats:
        row = found.get(run_id)
        out.append(None if row is None else HeartbeatAck(lease_expires_at=row[1].replace(tzinfo=UTC), cancel=row[2]))
    return out


def heartbeat(session: WriteSession, run_id: int, body: Heartbeat, settings: Settings,
              principal: Principal) -> HeartbeatAck:
    """Extend the caller's live lease. The common case is one conditional UPDATE and nothing else
    (``_extend_lease``); only when it matches no row is the run read, to answer why (404, finished,
    lost, another worker's lease, expired)."""
    now = utcnow()
    values: dict[str, Any] = {"lease_expires_at": now + timedelta(seconds=settings.lease_seconds)}
    if body.step is not None:
        values["progress_step"] = body.step
    if principal.role is not Role.admin:
        row = _extend_lease(session, run_id, body.lease_id, principal.token_id, now, values)
        if row is not None:
            return HeartbeatAck(lease_expires_at=row[0], cancel=row[1])
        _leased_state(session, run_id, body.lease_id, principal)  # raises the reason when it can tell
        raise _lost(run_id)  # the run changed between the UPDATE and the read
    # an admin may heartbeat any worker's lease: the run's holder is read first
    state = _leased_state(session, run_id, body.lease_id, principal)
    row = runs_repo.transition(session, state, body.lease_id, now, values,
                               returning=(Run.lease_expires_at, Run.cancel_requested))
    if row is None:
        _lost_race(session, run_id, body.lease_id, None, principal)  # raises: no request id to repeat
        raise _lost(run_id)
    if state.worker_id is not None:
        session.execute(update(Worker).where(Worker.id == state.worker_id).values(last_seen_at=now))
    return HeartbeatAck(lease_expires_at=row[0], cancel=row[1])


def _conflicts(conflicts: MetricConflicts | None) -> dict[str, Any] | None:
    """What the run stores of its capture conflicts (non-finite values as the wire spells them), and where its
    output's step counter went back (``restart``, kept only when there was one)."""
    if conflicts is None or not (conflicts.count or conflicts.restart):
        return None
    return conflicts.model_dump(mode="json", exclude={"restart", "restarts"} if conflicts.restart is None else None)


def complete(session: WriteSession, run_id: int, body: RunResult, principal: Principal) -> RunAck:
    now = utcnow()
    outcome = _apply(session, run_id, body.lease_id, body.request_id, principal, {
        "status": RunStatus.completed.value,
        "final_metrics": {k: wire_float(v) for k, v in body.final_metrics.items()},
        "digests": body.digests.model_dump(mode="json"),
        "fingerprint": body.fingerprint,
        "determinism_applied": body.determinism_applied,
        "timings": {k: wire_float(v) for k, v in body.timings.items()},
        "stderr_tail": body.stderr_tail or None,
        "argv": body.argv,
        "finished_at": now,
        "lease_expires_at": None,
    }, now)
    if isinstance(outcome, RunAck):
        return outcome
    study_id, attempt, _ = outcome
    runs_repo.add_conflicts(session, run_id, _conflicts(body.conflicts))
    metrics_repo.delete_other_attempts(session, run_id, attempt)
    settled.announce(session, study_id)
    return RunAck(run_id=run_id, status=RunStatus.completed)


def fail(session: WriteSession, run_id: int, body: RunFailure, principal: Principal) -> RunAck:
    now = utcnow()
    status = RunStatus.cancelled if body.kind is FailureKind.cancelled else RunStatus.failed
    values: dict[str, Any] = {
        "status": status.value,
        "failure_kind": body.kind.value,
        "error": body.error,
        "stderr_tail": body.stderr_tail,
        "argv": body.argv,
        "finished_at": now,
        "lease_expires_at": None,
    }
    if body.fingerprint:
        values["fingerprint"] = body.fingerprint
    if body.determinism_applied:
        values["determinism_applied"] = body.determinism_applied
    outcome = _apply(session, run_id, body.lease_id, body.request_id, principal, values, now)
    if isinstance(outcome, RunAck):
        return outcome
    study_id, _, _ = outcome
    runs_repo.add_conflicts(session, run_id, _conflicts(body.conflicts))
    settled.announce(session, study_id)
    return RunAck(run_id=run_id, status=status)


def release(session: WriteSession, run_id: int, body: RunRelease, principal: Principal) -> RunAck:
    """Give the run back to the queue; the attempt does not count and its points are dropped.

    A run whose study was cancelled meanwhile ends cancelled instead; the choice is made in the
    UPDATE, on the row as it is then, so a cancellation racing the release is not lost."""
    now = utcnow()
    cancelled = Run.cancel_requested.is_(True)
    status = case((cancelled, RunStatus.cancelled.value), else_=RunStatus.queued.value)
    outcome = _apply(session, run_id, body.lease_id, body.request_id, principal, {
        "status": status,
        "finished_at": case((cancelled, now), else_=Run.finished_at),
        "attempt": case((cancelled, Run.attempt), else_=Run.attempt - 1),  # a leased run's attempt is >= 1
        # the attempt's chunks are deleted below; the attempt before it kept none (deleted at this lease)
        "stored_points": 0,
        "stored_keys": 0,
        "lease_id": None,
        "lease_expires_at": None,
        "worker_id": None,
    }, now)
    if isinstance(outcome, RunAck):
        return outcome
    study_id, attempt, new_status = outcome
    # the attempt given back (a release back to the queue took one off it; a cancelled run's is kept)
    metrics_repo.delete_attempt(session, run_id, attempt if new_status == RunStatus.cancelled.value else attempt + 1)
    settled.announce(session, study_id)
    return RunAck(run_id=run_id, status=RunStatus(new_status))
