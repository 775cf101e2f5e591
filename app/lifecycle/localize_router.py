"""Localization jobs over HTTP: users ask for one and follow it; the worker holding its lease reports."""

from __future__ import annotations

from fastapi import APIRouter, Request, status

from steady.server.kit.deps import AppSettings, ProtocolCaller, ReadDB, UserCaller, WriteDB
from steady.server.kit.pagination import Page, PageQuery
from steady.server.lifecycle import localizing
from steady.server.lifecycle.localizing import LocalizationJobOut, LocalizationJobRequest
from steady.worker.contract.protocol import (
    LocalizationAck,
    LocalizationDone,
    LocalizationFailure,
    LocalizationHeartbeat,
    LocalizationHeartbeatAck,
    LocalizationRelease,
)

router = APIRouter(prefix="/api/v1", tags=["localization jobs"])


@router.post("/studies/{study_id}/localization-jobs", response_model=LocalizationJobOut,
             status_code=status.HTTP_201_CREATED)
def request_localization(study_id: int, body: LocalizationJobRequest, db: WriteDB,
                         caller: UserCaller) -> LocalizationJobOut:
    """Ask a worker to replay two diverging repeats and name the first op where they part (what `steady
    localize` does on your machine). The answer becomes part of the repeatability verdict, as the CLI's does.
    The study's owner or an admin; 422 naming `runs` when they are not two repeats of the study that a worker
    can replay (PyTorch or Keras code of a managed study); 409 when the pair is already pending or running."""
    return localizing.job_out(db, localizing.request(db, study_id, body, caller))


@router.get("/studies/{study_id}/localization-jobs", response_model=Page[LocalizationJobOut])
def list_localization_jobs(study_id: int, db: ReadDB, caller: UserCaller, page: PageQuery) -> Page[LocalizationJobOut]:
    """The study's localization jobs, newest first."""
    jobs, total = localizing.study_jobs(db, study_id, limit=page.limit, offset=page.offset)
    return Page.of([localizing.job_out(db, j) for j in jobs], total, page)


@router.get("/localization-jobs/{job_id}", response_model=LocalizationJobOut)
def get_localization_job(job_id: int, db: ReadDB, caller: UserCaller) -> LocalizationJobOut:
    return localizing.job_out(db, localizing.get_job(db, job_id))


@router.post("/localization-jobs/{job_id}/cancel", response_model=LocalizationJobOut)
def cancel_localization_job(job_id: int, db: WriteDB, caller: UserCaller) -> LocalizationJobOut:
    """A pending job ends at once; a running one is stopped by its worker at its next heartbeat."""
    return localizing.job_out(db, localizing.cancel(db, job_id, caller))


# --- worker side: on the protocol's own threads and connections (steady.server.kit.capacity) ---------------


@router.post("/localization-jobs/{job_id}/heartbeat", response_model=LocalizationHeartbeatAck,
             tags=["worker protocol"])
async def heartbeat(job_id: int, body: LocalizationHeartbeat, request: Request, caller: ProtocolCaller,
                    settings: AppSettings) -> LocalizationHeartbeatAck:
    return await request.app.state.protocol.write(localizing.heartbeat, job_id, body, settings, caller)


@router.post("/localization-jobs/{job_id}/complete", response_model=LocalizationAck, tags=["worker protocol"])
async def complete(job_id: int, body: LocalizationDone, request: Request, caller: ProtocolCaller) -> LocalizationAck:
    return await request.app.state.protocol.write(localizing.complete, job_id, body, caller)


@router.post("/localization-jobs/{job_id}/fail", response_model=LocalizationAck, tags=["worker protocol"])
async def fail(job_id: int, body: LocalizationFailure, request: Request, caller: ProtocolCaller) -> LocalizationAck:
    return await request.app.state.protocol.write(localizing.fail, job_id, body, caller)


@router.post("/localization-jobs/{job_id}/release", response_model=LocalizationAck, tags=["worker protocol"])
async def release(job_id: int, body: LocalizationRelease, request: Request, caller: ProtocolCaller) -> LocalizationAck:
    return await request.app.state.protocol.write(localizing.release, job_id, body, caller)
