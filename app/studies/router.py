from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from steady.server.kit.deps import AppSettings, ReadDB, UserCaller, WriteDB
from steady.server.kit.pagination import Page, PageQuery
from steady.server.studies import repository, service
from steady.server.runs import repository as runs_repo
from steady.server.runs.schemas import ExternalRunIn, RunOut
from steady.server.studies.schemas import StudyOut, StudySpec, StudySummary
from steady.worker.contract.protocol import RunStatus, StudyStatus

router = APIRouter(prefix="/api/v1/studies", tags=["studies"])

StudyStatusQ = Annotated[str | None, Query(pattern="^(" + "|".join(s.value for s in StudyStatus) + ")$")]
RunStatusQ = Annotated[str | None, Query(pattern="^(" + "|".join(s.value for s in RunStatus) + ")$")]


@router.post("", response_model=StudyOut, status_code=status.HTTP_201_CREATED)
def create_study(spec: StudySpec, db: WriteDB, caller: UserCaller, settings: AppSettings) -> StudyOut:
    study = service.create_study(db, spec, settings, caller)
    return service.to_out(db, [study])[0]


@router.get("", response_model=Page[StudySummary])
def list_studies(
    db: ReadDB,
    caller: UserCaller,
    page: PageQuery,
    status: StudyStatusQ = None,
    suite: Annotated[str | None, Query(max_length=200)] = None,
    name: Annotated[str | None, Query(max_length=200, description="substring of the name")] = None,
) -> Page[StudySummary]:
    rows, total = repository.list_studies(db, status=status, suite=suite, name=name, limit=page.limit,
                                          offset=page.offset)
    return Page.of(service.to_out(db, rows, summary=True), total, page)


@router.get("/{study_id}", response_model=StudyOut)
def get_study(study_id: int, db: ReadDB, caller: UserCaller) -> StudyOut:
    return service.to_out(db, [service.get_study(db, study_id)])[0]


@router.get("/{study_id}/runs", response_model=Page[RunOut])
def list_runs(study_id: int, db: ReadDB, caller: UserCaller, page: PageQuery, status: RunStatusQ = None) -> Page[RunOut]:
    service.get_study(db, study_id)
    """A page of the study's runs. A completed run's output tail is left out of the list (up to 60,000
    characters a run); ``GET /api/v1/runs/{id}`` has it."""
    rows, total = runs_repo.list_runs(db, study_id, status=status, limit=page.limit, offset=page.offset)
    items = [RunOut.model_validate(r, from_attributes=True) for r in rows]
    for item in items:
        if item.status == RunStatus.completed:
            item.stderr_tail = None
    return Page.of(items, total, page)


@router.post("/{study_id}/cancel", response_model=StudyOut)
def cancel_study(study_id: int, db: WriteDB, caller: UserCaller) -> StudyOut:
    return service.to_out(db, [service.cancel_study(db, study_id, caller)])[0]


@router.post("/{study_id}/runs", response_model=RunOut, status_code=status.HTTP_201_CREATED)
def upload_run(study_id: int, body: ExternalRunIn, db: WriteDB, caller: UserCaller, settings: AppSettings) -> RunOut:
    run = service.upload_external_run(db, study_id, body, settings, caller)
    return RunOut.model_validate(run, from_attributes=True)
