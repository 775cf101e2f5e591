"""Dashboard pages (server-rendered); access and login in ``access``, the JSON feeds in ``feeds``."""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Query, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from steady.server.dashboard import access, actions, bisect, feeds, fleet, service
from steady.server.dashboard.access import PageViewer
from steady.server.dashboard.feeds import STUDIES_PER_PAGE
from steady.server.dashboard.views import HERE, db_key, not_found, render
from steady.server.kit.deps import ReadDB
from steady.server.launches import hints
from steady.server.lifecycle import localizing
from steady.server.lifecycle.service import run_story
from steady.server.models import Run, Study, Worker
from steady.server.runs import repository as runs_repo
from steady.server.runs.conflicts import conflict_phrase, conflict_summary
from steady.server.workers import service as workers_service
from steady.worker.contract.protocol import LocalizationStatus, StudyStatus

router = APIRouter(include_in_schema=False)
router.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
router.include_router(access.router)
router.include_router(feeds.router)
router.include_router(actions.router)
router.include_router(fleet.router)
router.include_router(bisect.router)

RUNS_PER_PAGE = 100
STUDY_STATUSES = tuple(s.value for s in StudyStatus)


@router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse("/studies", status_code=status.HTTP_303_SEE_OTHER)


@router.get("/studies", response_class=HTMLResponse)
def studies_page(
    request: Request,
    db: ReadDB,
    viewer: PageViewer,
    status_: Annotated[str | None, Query(alias="status")] = None,
    name: Annotated[str | None, Query(max_length=200)] = None,
    page: Annotated[int, Query(ge=1, le=100_000)] = 1,
) -> HTMLResponse:
    status_ = status_ if status_ in STUDY_STATUSES else None
    name = (name or "").strip() or None
    rows, total = service.studies_page(db, db_key(request), status=status_, name=name, page=page,
                                       per_page=STUDIES_PER_PAGE)
    pages = max(1, math.ceil(total / STUDIES_PER_PAGE))
    return render(request, "studies.html", viewer, rows=rows, total=total, page=page, pages=pages,
                   status=status_, name=name or "", statuses=STUDY_STATUSES, levels=service.BADGE_COLUMNS,
                   level_titles=service.BADGE_TITLES)


@router.get("/studies/{study_id}", response_class=HTMLResponse)
def study_page(
    request: Request,
    study_id: int,
    db: ReadDB,
    viewer: PageViewer,
    runs_page: Annotated[int, Query(ge=1, le=100_000)] = 1,
) -> HTMLResponse:
    study = db.get(Study, study_id)
    if study is None:
        return not_found(request, viewer, f"study {study_id}")
    version = service.study_versions(db, [study])[study.id]
    progress = service.progress_of(db, study)
    settled = service.is_settled(progress)
    report = service.report(db, study, version, db_key(request)) if settled else \
        service.cached_report(study, version, db_key(request))
    if report is None and progress.completed:
        # Still running: judge what has finished so far (cached until the next run ends).
        report = service.report(db, study, version, db_key(request))
    runs, n_runs = service.study_runs(db, study.id, limit=RUNS_PER_PAGE, offset=(runs_page - 1) * RUNS_PER_PAGE)
    groups = service.study_groups(db, study.id)
    verdicts_by_level = {level: report.of_level(level) if report else [] for level in service.LEVELS}
    return render(
        request, "study.html", viewer, study=study, **_localize_context(request, db, viewer, study), progress=progress, report=report,
        badges=service.badges(report) if report else None, verdicts_by_level=verdicts_by_level,
        level_titles=service.LEVEL_TITLES, runs=runs, n_runs=n_runs, runs_page=runs_page,
        runs_pages=max(1, math.ceil(n_runs / RUNS_PER_PAGE)), groups=groups,
        levels_present=service.chart_levels(groups),
        stacks_present=list(dict.fromkeys(s for _, s in groups)),
        metrics=service.study_metrics(study), version=service.version_tag(version),
        cost_top=service.cost_scale(report),
        stages=service.study_stages(db, study),
        live=study.status in StudyStatus.ACTIVE or study.status == StudyStatus.open,
    )


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: int, db: ReadDB, viewer: PageViewer) -> HTMLResponse:
    run = runs_repo.find_run(db, run_id)
    if run is None:
        return not_found(request, viewer, f"run {run_id}")
    study = db.get(Study, run.study_id)
    if study is None:
        return not_found(request, viewer, f"run {run_id}")
    worker = db.get(Worker, run.worker_id) if run.worker_id is not None else None
    return render(request, "run.html", viewer, run=run, study=study, worker=worker, story=run_story(db, run),
                   **_localize_context(request, db, viewer, study, run), partners=service.repeat_partners(db, run),
                   keys=service.run_keys(db, run), engine_job=hints.job_label(run.engine),
                   engine_logs=hints.log_hint(run.engine),
                   conflicts_summary=conflict_summary(run.metric_conflicts),
                   conflicts=[conflict_phrase(c) for c in (run.metric_conflicts or {}).get("first") or []])


def _localize_context(request: Request, db: ReadDB, viewer: PageViewer, study: Study, run: Run | None = None) -> dict:
    """The Localize button's and the localization jobs' part of a study or run page."""
    jobs = [localizing.job_out(db, j) for j in localizing.recent_jobs(db, study.id, run.id if run else None)]
    return dict(
        jobs=jobs, jobs_active=any(j.status in LocalizationStatus.ACTIVE for j in jobs),
        may_localize=viewer.may_change(study.owner_token_id) and study.kind == "managed"
        and (run is None or run.framework in localizing.REPLAYABLE),
        localize_error=request.query_params.get("localize_error"),
        here=request.url.path,
    )


@router.get("/workers", response_class=HTMLResponse)
def workers_page(request: Request, db: ReadDB, viewer: PageViewer) -> HTMLResponse:
    workers = workers_service.list_workers(db)
    run_ids = [rid for _, running in workers for rid in running]
    runs = runs_repo.runs_by_id(db, run_ids)
    return render(request, "workers.html", viewer, workers=workers, runs=runs,
                   lease_seconds=request.app.state.settings.lease_seconds)


@router.get("/alerts", response_class=HTMLResponse)
def alerts_page(request: Request, db: ReadDB, viewer: PageViewer) -> HTMLResponse:
    if not service.alerts_available():
        return render(request, "alerts.html", viewer, available=False, firing=[], resolved=[])
    firing, resolved = service.list_alerts(db)
    return render(request, "alerts.html", viewer, available=True, firing=firing, resolved=resolved)
