from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from steady.server.kit.deps import Principal
from steady.server.kit.errors import NotFound
from steady.server.kit.auth import Role
from steady.server.kit.db import WriteSession
from steady.server.models import Worker, utcnow
from steady.server.kit.repository import paginate
from steady.server.runs import repository as runs_repo
from steady.worker.contract.protocol import WorkerRegistration


def register(session: WriteSession, body: WorkerRegistration, principal: Principal) -> Worker:
    """Register a worker, or refresh the row of the same name registered with the same token."""
    worker = session.scalars(
        select(Worker).where(Worker.name == body.name, Worker.token_id == principal.token_id)
    ).first()
    now = utcnow()
    if worker is None:
        worker = Worker(name=body.name, token_id=principal.token_id, registered_at=now)
        session.add(worker)
    worker.labels = sorted(set(body.labels))
    worker.fingerprint = body.fingerprint
    worker.engine = body.engine.model_dump(mode="json") if body.engine else None
    worker.last_seen_at = now
    session.flush()
    return worker


def get_for(session: Session, worker_id: int, principal: Principal) -> Worker:
    worker = session.get(Worker, worker_id)
    # A worker token may only act as the workers it registered.
    if worker is None or (principal.role is not Role.admin and worker.token_id != principal.token_id):
        raise NotFound(f"worker {worker_id} not found (register first)")
    return worker


def list_workers(session: Session) -> list[tuple[Worker, list[int]]]:
    return _with_running(session, list(session.scalars(select(Worker).order_by(Worker.id))))


def workers_page(session: Session, *, limit: int, offset: int) -> tuple[list[tuple[Worker, list[int]]], int]:
    workers, total = paginate(session, select(Worker), limit=limit, offset=offset, order_by=Worker.id)
    return _with_running(session, workers), total


def _with_running(session: Session, workers: list[Worker]) -> list[tuple[Worker, list[int]]]:
    """Each worker with the ids of the runs it is running now."""
    running = runs_repo.running_by_worker(session) if workers else {}
    return [(w, running.get(w.id, [])) for w in workers]


def running_of(session: Session, worker_id: int) -> list[int]:
    return runs_repo.running_by_worker(session).get(worker_id, [])
