from __future__ import annotations

from datetime import datetime
from typing import Any

from typing import Annotated

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from steady.server.kit.config import Settings
from steady.server.kit.db import WriteSession
from steady.server.alerts import quarantine
from steady.server.kit.deps import AdminCaller, AppSettings, Principal, ProtocolCaller, ReadDB, UserCaller, WriteDB
from steady.server.kit.errors import NotFound
from steady.server.models import Worker, WorkerEvent
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


class QuarantineOut(BaseModel):
    since: datetime
    by: str | None
    reason: str | None
    study_id: int | None = Field(description="the fleet check that quarantined the worker, if one did")


class WorkerOut(BaseModel):
    id: int
    name: str
    labels: list[str]
    fingerprint: dict[str, Any]
    engine: EngineJob | None = None
    registered_at: datetime
    last_seen_at: datetime
    running_runs: list[int]
    quarantine: QuarantineOut | None = Field(
        None, description="set while the worker is quarantined: it leases no run of a study that respects quarantine")
    quarantine_lifted_at: datetime | None = None
    quarantine_lifted_by: str | None = None


class QuarantineIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(min_length=1, max_length=2000, pattern=r"\S")] = Field(
        description="why: kept in the worker's history and sent with the alert")


class ReleaseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(max_length=2000)] | None = Field(None, description="kept in the worker's history")


class WorkerEventOut(BaseModel):
    id: int
    worker_id: int
    kind: str = Field(description="quarantined, released, or check (a fleet check's result for this worker)")
    at: datetime
    actor: str | None
    reason: str | None
    study_id: int | None
    verdict: str | None = Field(description="a check's verdict for this worker")
    first_divergent_step: int | None = Field(
        description="a check's first step where this worker's runs part from its peers'")
    details: dict[str, Any]


def worker_out(w: Worker, running: list[int]) -> WorkerOut:
    q = None if w.quarantined_at is None else QuarantineOut(
        since=w.quarantined_at, by=w.quarantined_by, reason=w.quarantine_reason, study_id=w.quarantine_study_id)
    return WorkerOut(id=w.id, name=w.name, labels=w.labels, fingerprint=w.fingerprint, engine=w.engine,
                     registered_at=w.registered_at, last_seen_at=w.last_seen_at, running_runs=running,
                     quarantine=q, quarantine_lifted_at=w.quarantine_lifted_at,
                     quarantine_lifted_by=w.quarantine_lifted_by)


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
    return Page.of([worker_out(w, running) for w, running in rows], total, page)


def _worker(db, worker_id: int) -> Worker:
    worker = db.get(Worker, worker_id)
    if worker is None:
        raise NotFound(f"worker {worker_id} not found")
    return worker


@router.post("/{worker_id}/quarantine", response_model=WorkerOut)
def quarantine_worker(worker_id: int, body: QuarantineIn, db: WriteDB, caller: AdminCaller,
                      settings: AppSettings) -> WorkerOut:
    """Quarantine a worker (admin): it leases no run of a study that respects quarantine (every study unless
    its spec sets ``respect_quarantine: false``; a fleet check's default is false) until released. Recorded in
    the worker's history; its alert fires through every webhook. A worker quarantined already is left as it is."""
    worker = _worker(db, worker_id)
    quarantine.quarantine(db, worker, reason=body.reason.strip(), actor=caller.name, base_url=settings.base_url)
    return worker_out(worker, service.running_of(db, worker.id))


@router.post("/{worker_id}/release", response_model=WorkerOut)
def release_worker(worker_id: int, body: ReleaseIn, db: WriteDB, caller: AdminCaller,
                   settings: AppSettings) -> WorkerOut:
    """Lift a worker's quarantine (admin); 409 when it is not quarantined. Recorded in the worker's history;
    its alert is resolved through every webhook."""
    worker = _worker(db, worker_id)
    quarantine.release(db, worker, actor=caller.name, base_url=settings.base_url,
                       reason=body.reason.strip() if body.reason else None)
    return worker_out(worker, service.running_of(db, worker.id))


@router.get("/{worker_id}/history", response_model=Page[WorkerEventOut])
def worker_history(worker_id: int, db: ReadDB, caller: UserCaller, page: PageQuery) -> Page[WorkerEventOut]:
    """The worker's history, newest first: quarantines and releases (who, why) and its fleet-check results
    (study, verdict, first divergent step)."""
    _worker(db, worker_id)
    rows, total = quarantine.history(db, worker_id, limit=page.limit, offset=page.offset)
    return Page.of([event_out(e) for e in rows], total, page)


def event_out(e: WorkerEvent) -> WorkerEventOut:
    return WorkerEventOut.model_validate(e, from_attributes=True)
