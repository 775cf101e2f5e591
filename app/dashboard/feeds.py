"""The small JSON feeds the dashboard's scripts poll, and the chart data they draw.

Chart payloads are large and compress ~3×: ``create_app`` puts the feeds (every path under
``FEEDS_PREFIX``) behind Starlette's GZipMiddleware, which compresses bodies over 1 kB when the
browser accepts gzip (``GZipFeeds``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from steady.server.dashboard import service
from steady.server.dashboard.access import DataViewer
from steady.server.dashboard.views import db_key
from steady.server.kit.deps import ReadDB
from steady.server.kit.errors import NotFound
from steady.server.models import Study
from steady.server.kit.repository import get_or_404
from steady.server.runs import repository as runs_repo
from steady.worker.contract.protocol import StudyStatus

STUDIES_PER_PAGE = 25  # the studies page's size: a badges request asks for at most a few pages


FEEDS_PREFIX = "/dashboard/data/"


class GZipFeeds:
    """Starlette's GZipMiddleware for the feeds only. The API's routes stay uncompressed: their
    clients are workers and scripts on fast links, for which compressing costs more than it saves."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.gzip = GZipMiddleware(app, minimum_size=1024, compresslevel=5)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(FEEDS_PREFIX):
            await self.gzip(scope, receive, send)
        else:
            await self.app(scope, receive, send)


router = APIRouter(include_in_schema=False)


def _json_text(text: str) -> Response:
    """JSON already rendered by the chart code (GZipFeeds compresses it)."""
    return Response(text, media_type="application/json", headers={"Cache-Control": "no-store"})


@router.get("/dashboard/data/badges")
def badges_feed(
    request: Request, db: ReadDB, viewer: DataViewer,
    ids: Annotated[str, Query(max_length=2000, pattern=r"^\d+(,\d+)*$")],
) -> JSONResponse:
    study_ids = [int(i) for i in ids.split(",")][:STUDIES_PER_PAGE * 4]
    found = service.badges_for(db, db_key(request), study_ids)
    return JSONResponse({"badges": {str(k): v for k, v in found.items()}})


@router.get("/dashboard/data/studies/{study_id}/state")
def study_state(study_id: int, db: ReadDB, viewer: DataViewer) -> JSONResponse:
    study = get_or_404(db, Study, study_id)
    version = service.study_versions(db, [study])[study.id]
    progress = service.progress_of(db, study)
    return JSONResponse({"id": study.id, "status": study.status, "version": service.version_tag(version),
                         "progress": progress.model_dump(),
                         "live": study.status in StudyStatus.ACTIVE or study.status == StudyStatus.open},
                        headers={"Cache-Control": "no-store"})


def _versioned_study(db: ReadDB, study_id: int) -> tuple[Study, Any]:
    """The study (404 if there is none) and its version, the key of its cached charts."""
    study = get_or_404(db, Study, study_id)
    return study, service.study_versions(db, [study])[study.id]


@router.get("/dashboard/data/studies/{study_id}/chart")
def study_chart(
    request: Request,
    study_id: int,
    db: ReadDB,
    viewer: DataViewer,
    metric: Annotated[str, Query(min_length=1, max_length=200)],
    determinism: Annotated[str, Query(min_length=1, max_length=16)],
    stack: Annotated[str, Query(min_length=1, max_length=200)],
    max_points: Annotated[int, Query(ge=100, le=5000)] = 1000,
    max_lines: Annotated[int, Query(ge=0, le=200)] = 40,
) -> Response:
    study, version = _versioned_study(db, study_id)
    text = service.group_chart(db, study, version, db_key(request), metric=metric, determinism=determinism,
                               stack=stack, max_points=max_points, max_lines=max_lines)
    return _json_text(text)


@router.get("/dashboard/data/studies/{study_id}/difference")
def study_difference(
    request: Request,
    study_id: int,
    db: ReadDB,
    viewer: DataViewer,
    metric: Annotated[str, Query(min_length=1, max_length=200)],
    determinism: Annotated[str, Query(min_length=1, max_length=16)],
    stack: Annotated[str, Query(min_length=1, max_length=200)],
    unit: Annotated[str, Query(pattern="^(abs|ulp)$")] = "abs",
    max_points: Annotated[int, Query(ge=100, le=5000)] = 1000,
) -> Response:
    study, version = _versioned_study(db, study_id)
    text = service.difference_chart(db, study, version, db_key(request), metric=metric, determinism=determinism,
                                    stack=stack, unit=unit, max_points=max_points)
    return _json_text(text)


@router.get("/dashboard/data/runs/{run_id}/chart")
def run_chart(
    request: Request,
    run_id: int,
    db: ReadDB,
    viewer: DataViewer,
    key: Annotated[str, Query(min_length=1, max_length=200)],
    max_points: Annotated[int, Query(ge=100, le=5000)] = 1000,
) -> Response:
    run = runs_repo.find_run(db, run_id)
    text = service.run_chart(db, run, key, max_points) if run is not None else None
    if text is None:
        raise NotFound(f"run {run_id} has no metric {key!r}")
    return _json_text(text)
