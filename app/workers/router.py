from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from steady.server.kit.config import Settings
from steady.server.kit.db import WriteSession
from steady.server.kit.deps import AppSettings, Principal, ProtocolCaller, ReadDB, UserCaller
from steady.server.kit.pagination import Page, PageQuery
from steady.server.lifecycle import leasing, localizing
from steady.server.workers import service
from steady.worker.contract.protocol import (
    LOCALIZATIONS_HEADER,
    PENDING_HEADER,
    EngineJob,
    Lease,
    LeaseRequest,
    LocalizationLease,
    LocalizationLeaseRequest,
    WorkerRegistered,
    WorkerRegistration,
)

router = APIRouter(prefix="/api/v1/workers", tags=["workers"])


class WorkerOut(BaseModel):
    id: int
    name: str
    labels: list[str]
    fingerprint: dict[str, Any]
    engine: EngineJob | None = None
    registered_at: datetime
    last_seen_at: datetime
    running_runs: list[int]


# The worker protocol's routes run on its own threads and connections (steady.server.kit.capacity).


def _register(db: WriteSession, body: WorkerRegistration, caller: Principal, settings: Settings) -> WorkerRegistered:
    worker = service.register(db, body, caller)
    return WorkerRegistered(
        worker_id=worker.id,
        name=worker.name,
        labels=worker.labels,
        lease_seconds=settings.lease_seconds,
        heartbeat_seconds=settings.heartbeat_seconds,
    )


@router.post("/register", response_model=WorkerRegistered)
async def register(body: WorkerRegistration, request: Request, caller: ProtocolCaller,
                   settings: AppSettings) -> WorkerRegistered:
    return await request.app.state.protocol.write(_register, body, caller, settings)


def _lease(db: WriteSession, worker_id: int, body: LeaseRequest, caller: Principal, settings: Settings):
    worker = service.get_for(db, worker_id, caller)
    leased = leasing.lease_next(db, worker, settings, body.request_id, study_id=body.study_id,
                                builtin_only=bool(body.builtin_only), run_credential=bool(body.run_credential))
    if leased is None:
        pending = leasing.running_in_scope(db, body.study_id)
        waiting = localizing.pending_count(db, body.study_id)
        return Response(status_code=204, headers={PENDING_HEADER: str(pending), LOCALIZATIONS_HEADER: str(waiting)})
    if leased.run_token is None:  # a worker that did not ask: its Lease model has no such field
        return Response(leased.model_dump_json(exclude={"run_token"}), media_type="application/json")
    return leased


@router.post(
    "/{worker_id}/lease",
    response_model=Lease,
    responses={
        204: {
            "description": "nothing queued (in the request's study, if given) that this worker's labels can run",
            "headers": {PENDING_HEADER: {"description": "runs in scope still running elsewhere; 0: nothing left",
                                         "schema": {"type": "integer"}},
                        LOCALIZATIONS_HEADER: {"description": "localization jobs in scope waiting for a worker "
                                               "(POST localization-lease takes one)", "schema": {"type": "integer"}}},
        },
        429: {"description": "this worker holds STEADY_MAX_LEASES_PER_WORKER leases already"},
    },
)
async def lease(worker_id: int, body: LeaseRequest, request: Request, caller: ProtocolCaller, settings: AppSettings):
    return await request.app.state.protocol.write(_lease, worker_id, body, caller, settings)


@router.post(
    "/{worker_id}/localization-lease",
    response_model=LocalizationLease,
    responses={204: {"description": "no localization job in scope that this worker's labels can run"}},
)
async def localization_lease(worker_id: int, body: LocalizationLeaseRequest, request: Request, caller: ProtocolCaller,
                             settings: AppSettings):
    """Lease a localization job (two repeats to replay and localize), as a run is leased: a repeated
    ``request_id`` gets the same job back. Workers ask when a lease answer announced some (its
    ``X-Steady-Localizations`` header)."""
    def work(db: WriteSession):
        worker = service.get_for(db, worker_id, caller)
        leased = localizing.lease_next(db, worker, settings, body.request_id, study_id=body.study_id,
                                       builtin_only=bool(body.builtin_only))
        return Response(status_code=204) if leased is None else leased

    return await request.app.state.protocol.write(work)


@router.get("", response_model=Page[WorkerOut])
def list_workers(db: ReadDB, caller: UserCaller, page: PageQuery) -> Page[WorkerOut]:
    rows, total = service.workers_page(db, limit=page.limit, offset=page.offset)
    items = [
        WorkerOut(
            id=w.id,
            name=w.name,
            labels=w.labels,
            fingerprint=w.fingerprint,
            engine=w.engine,
            registered_at=w.registered_at,
            last_seen_at=w.last_seen_at,
            running_runs=running,
        )
        for w, running in rows
    ]
    return Page.of(items, total, page)
