"""Dashboard pages (server-rendered) and the small JSON feeds their scripts poll.

Access: a user or admin token, sent as ``Authorization: Bearer``, or a server-side session
whose random id is the HTTP-only ``steady_session`` cookie that ``POST /login`` sets (the
token itself never reaches the browser's storage; logout revokes the session). Unauthenticated page requests are
redirected to ``/login``; the JSON feeds answer 401. With ``STEADY_PUBLIC_DASHBOARD=true``
every page is readable without a token (the dashboard never writes).
"""

from __future__ import annotations

import gzip
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Depends, Form, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape
from sqlalchemy import select

from app.auth.service import GRANTS, Role, authenticate, create_session, revoke_session
from app.dashboard import service
from app.deps import SESSION_COOKIE, ReadDB, _bearer, _credentials, caller_token
from app.errors import NotFound
from app.launches import hints
from app.models import Run, Study, Worker
from app.repository import get_or_404
from app.workers import service as workers_service

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
router = APIRouter(include_in_schema=False)
router.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")

STUDIES_PER_PAGE = 25
RUNS_PER_PAGE = 100
STUDY_STATUSES = ("queued", "running", "completed", "failed", "cancelled", "open")


# --- who is looking ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Viewer:
    name: str | None  # None: an anonymous reader of a public dashboard
    public: bool


def _viewer(request: Request, creds: HTTPAuthorizationCredentials | None) -> Viewer | None:
    settings = request.app.state.settings
    if _credentials(request, creds) is not None:
        with request.app.state.database.read() as session:
            row = caller_token(session, request, creds)
            if row is not None and Role(row.role) in GRANTS[Role.user]:
                return Viewer(name=row.name, public=settings.public_dashboard)
    if settings.public_dashboard:
        return Viewer(name=None, public=True)
    return None


def page_viewer(
    request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Viewer:
    viewer = _viewer(request, creds)
    if viewer is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise HTTPException(status.HTTP_303_SEE_OTHER, "login required",
                            headers={"Location": f"/login?next={quote(target, safe='')}"})
    return viewer


def data_viewer(
    request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Viewer:
    viewer = _viewer(request, creds)
    if viewer is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "login required")
    return viewer


PageViewer = Annotated[Viewer, Depends(page_viewer)]
DataViewer = Annotated[Viewer, Depends(data_viewer)]


def _safe_next(target: str | None) -> str:
    """Only local paths: never redirect a fresh login to another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/studies"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return "/studies"
    return target


def _same_origin(request: Request) -> bool:
    """A form post from another site carries its own Origin; refuse it (login CSRF).

    The Origin must name this server as the browser sees it: the scheme (https behind a trusted
    proxy's X-Forwarded-Proto) and the Host header with its port (a proxy must pass the Host it
    received, port included: nginx's ``$http_host``, not ``$host``)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    parts = urlsplit(origin)
    return _netloc(parts.scheme, parts.netloc) == _netloc(request.url.scheme, request.headers.get("host", ""))


def _netloc(scheme: str, netloc: str) -> str:
    default = {"http": ":80", "https": ":443"}.get(scheme.lower(), "")
    netloc = netloc.lower()
    return f"{scheme.lower()}://{netloc[: -len(default)] if default and netloc.endswith(default) else netloc}"


def _db_key(request: Request) -> str:
    return request.app.state.settings.resolved_database_url


def _render(request: Request, template: str, viewer: Viewer | None, status_code: int = 200, **context) -> HTMLResponse:
    return templates.TemplateResponse(
        request, template, {"viewer": viewer, "now": datetime.now(UTC), **context}, status_code=status_code
    )


def _not_found(request: Request, viewer: Viewer, what: str) -> HTMLResponse:
    return _render(request, "not_found.html", viewer, status_code=404, what=what)


# --- filters used by the templates ------------------------------------------------------------


def _ago(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return "—"
    now = now or datetime.now(UTC)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    s = (now - value).total_seconds()
    if s < 0:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{int(s // size)} {unit} ago"
    return f"{int(s)} s ago"


def _duration(run: Run) -> str:
    if run.started_at is None:
        return "—"
    end = run.finished_at or datetime.now(UTC)
    start = run.started_at if run.started_at.tzinfo else run.started_at.replace(tzinfo=UTC)
    end = end if end.tzinfo else end.replace(tzinfo=UTC)
    s = (end - start).total_seconds()
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _short(digest: object, n: int = 10) -> str:
    if digest is None or digest == "" or digest == []:
        return "—"
    if isinstance(digest, list):
        return f"{_short(digest[0], n)} (+{len(digest) - 1})" if len(digest) > 1 else _short(digest[0], n)
    text = str(digest)
    return text if len(text) <= n else text[:n] + "…"


def _num(value: object, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}g}" if math.isfinite(value) else str(value)
    return str(value)


def _pct(value: object) -> str:
    return f"{value * 100:.0f} %" if isinstance(value, (int, float)) else "—"


def _group(group: dict) -> str:
    if "candidate_stack" in group:
        return f"{group.get('determinism')}: {group.get('candidate_stack')} vs {group.get('reference_stack')}"
    return f"{group.get('determinism')} · {group.get('stack')}"


_MD_INLINE = re.compile(r"`([^`\n]+)`|\*\*([^*\n]+)\*\*|(?<![*\w])\*([^*\n]+)\*(?![*\w])")


def _markdown_inline(text: object) -> Markup:
    """The inline Markdown people write in descriptions (`code`, **bold**, *em*), escaped
    first so nothing else in the text becomes markup; blank lines separate paragraphs."""
    def one(m: re.Match) -> str:
        code, bold, em = m.groups()
        if code is not None:
            return f"<code>{code}</code>"
        return f"<strong>{bold}</strong>" if bold is not None else f"<em>{em}</em>"

    paragraphs = re.split(r"\n\s*\n", str(text or "").strip())
    return Markup("".join(f"<p>{_MD_INLINE.sub(one, str(escape(p)))}</p>" for p in paragraphs if p))


def _when(value: datetime) -> str:
    """A timestamp for people: UTC, to the second (no microseconds, no ISO 'T')."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


templates.env.filters["when"] = _when
templates.env.tests["loss_like"] = lambda name: bool(re.search(r"loss|mse|mae|rmse|error|perplexity|nll", str(name), re.IGNORECASE))
templates.env.filters.update(ago=_ago, duration=_duration, short=_short, num=_num, pct=_pct, group=_group,
                             tone=service.tone, markdown_inline=_markdown_inline)


# --- login ------------------------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str | None = None) -> HTMLResponse:
    return _render(request, "login.html", None, next=_safe_next(next), error=None)


@router.post("/login", response_model=None)
def login(request: Request, token: Annotated[str, Form(max_length=500)] = "",
          next: Annotated[str, Form(max_length=2000)] = "/studies") -> Response:
    if not _same_origin(request):
        return _render(request, "login.html", None, status_code=403, next=_safe_next(next),
                       error="This form was posted from another site.")
    token = token.strip()
    with request.app.state.database.read() as session:
        row = authenticate(session, token) if token else None
        role = Role(row.role) if row is not None else None
        token_id = row.id if row is not None else None
    if row is None:
        return _render(request, "login.html", None, status_code=401, next=_safe_next(next),
                       error="That token is not valid (or was revoked).")
    if role not in GRANTS[Role.user]:
        return _render(request, "login.html", None, status_code=403, next=_safe_next(next),
                       error=f"A {role.value} token cannot open the dashboard; use a user or admin token.")
    settings = request.app.state.settings
    with request.app.state.database.write() as session:
        sid = create_session(session, token_id, settings.session_ttl_seconds)
    response = RedirectResponse(_safe_next(next), status_code=status.HTTP_303_SEE_OTHER)
    # The cookie holds the session id only, never the token. Secure when the browser came over
    # https (directly, or through a trusted proxy: STEADY_FORWARDED_ALLOW_IPS).
    response.set_cookie(
        SESSION_COOKIE, sid, max_age=int(settings.session_ttl_seconds), httponly=True, samesite="lax",
        secure=request.url.scheme == "https", path="/",
    )
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    if not _same_origin(request):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "cross-site logout refused")
    sid = request.cookies.get(SESSION_COOKIE)
    if sid:
        with request.app.state.database.write() as session:
            revoke_session(session, sid)
    response = RedirectResponse("/login", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax")
    return response


# --- pages --------------------------------------------------------------------------------------


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
    rows, total = service.studies_page(db, _db_key(request), status=status_, name=name, page=page,
                                       per_page=STUDIES_PER_PAGE)
    pages = max(1, math.ceil(total / STUDIES_PER_PAGE))
    return _render(request, "studies.html", viewer, rows=rows, total=total, page=page, pages=pages,
                   status=status_, name=name or "", statuses=STUDY_STATUSES, levels=service.LEVELS,
                   level_titles=service.LEVEL_TITLES)


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
        return _not_found(request, viewer, f"study {study_id}")
    version = service.study_versions(db, [study])[study.id]
    progress = service.progress_of(db, study)
    settled = service.is_settled(progress)
    report = service.report(db, study, version, _db_key(request)) if settled else \
        service.cached_report(study, version, _db_key(request))
    if report is None and progress.completed:
        # Still running: judge what has finished so far (cached until the next run ends).
        report = service.report(db, study, version, _db_key(request))
    runs, n_runs = service.study_runs(db, study.id, limit=RUNS_PER_PAGE, offset=(runs_page - 1) * RUNS_PER_PAGE)
    groups = service.study_groups(db, study.id)
    verdicts_by_level = {level: [v for v in (report or {}).get("verdicts", []) if v["level"] == level]
                         for level in service.LEVELS}
    return _render(
        request, "study.html", viewer, study=study, progress=progress, report=report,
        badges=service.badges(report) if report else None, verdicts_by_level=verdicts_by_level,
        level_titles=service.LEVEL_TITLES, runs=runs, n_runs=n_runs, runs_page=runs_page,
        runs_pages=max(1, math.ceil(n_runs / RUNS_PER_PAGE)), groups=groups,
        levels_present=service.chart_levels(groups),
        stacks_present=list(dict.fromkeys(s for _, s in groups)),
        metrics=service.study_metrics(study), version=service.version_tag(version),
        cost_top=service.cost_scale(report),
        stages=service.study_stages(db, study),
        live=study.status in service.ACTIVE_STATUSES or study.status == "open",
    )


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: int, db: ReadDB, viewer: PageViewer) -> HTMLResponse:
    run = db.get(Run, run_id)
    if run is None:
        return _not_found(request, viewer, f"run {run_id}")
    study = db.get(Study, run.study_id)
    worker = db.get(Worker, run.worker_id) if run.worker_id is not None else None
    return _render(request, "run.html", viewer, run=run, study=study, worker=worker,
                   keys=service.run_keys(db, run), engine_job=hints.job_label(run.engine),
                   engine_logs=hints.log_hint(run.engine))


@router.get("/workers", response_class=HTMLResponse)
def workers_page(request: Request, db: ReadDB, viewer: PageViewer) -> HTMLResponse:
    workers = workers_service.list_workers(db)
    run_ids = [rid for _, running in workers for rid in running]
    runs = {r.id: r for r in db.scalars(select(Run).where(Run.id.in_(run_ids)))} if run_ids else {}
    return _render(request, "workers.html", viewer, workers=workers, runs=runs,
                   lease_seconds=request.app.state.settings.lease_seconds)


@router.get("/alerts", response_class=HTMLResponse)
def alerts_page(request: Request, db: ReadDB, viewer: PageViewer) -> HTMLResponse:
    if not service.alerts_available():
        return _render(request, "alerts.html", viewer, available=False, firing=[], resolved=[])
    firing, resolved = service.list_alerts(db)
    return _render(request, "alerts.html", viewer, available=True, firing=firing, resolved=resolved)


# --- JSON feeds for the pages' scripts ---------------------------------------------------------


def _json_text(request: Request, text: str) -> Response:
    """Chart payloads are large and compress ~3×: gzip them when the browser accepts it."""
    body = text.encode()
    headers = {"Cache-Control": "no-store"}
    if len(body) > 1024 and "gzip" in request.headers.get("accept-encoding", ""):
        body = gzip.compress(body, compresslevel=5)
        headers["Content-Encoding"] = "gzip"
        headers["Vary"] = "Accept-Encoding"
    return Response(body, media_type="application/json", headers=headers)


@router.get("/dashboard/data/badges")
def badges_feed(
    request: Request, db: ReadDB, viewer: DataViewer,
    ids: Annotated[str, Query(max_length=2000, pattern=r"^\d+(,\d+)*$")],
) -> JSONResponse:
    study_ids = [int(i) for i in ids.split(",")][:STUDIES_PER_PAGE * 4]
    found = service.badges_for(db, _db_key(request), study_ids)
    return JSONResponse({"badges": {str(k): v for k, v in found.items()}})


@router.get("/dashboard/data/studies/{study_id}/state")
def study_state(study_id: int, db: ReadDB, viewer: DataViewer) -> JSONResponse:
    study = get_or_404(db, Study, study_id)
    version = service.study_versions(db, [study])[study.id]
    progress = service.progress_of(db, study)
    return JSONResponse({"id": study.id, "status": study.status, "version": service.version_tag(version),
                         "progress": progress.model_dump(),
                         "live": study.status in service.ACTIVE_STATUSES or study.status == "open"},
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
    text = service.group_chart(db, study, version, _db_key(request), metric=metric, determinism=determinism,
                               stack=stack, max_points=max_points, max_lines=max_lines)
    return _json_text(request, text)


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
    text = service.difference_chart(db, study, version, _db_key(request), metric=metric, determinism=determinism,
                                    stack=stack, unit=unit, max_points=max_points)
    return _json_text(request, text)


@router.get("/dashboard/data/runs/{run_id}/chart")
def run_chart(
    request: Request,
    run_id: int,
    db: ReadDB,
    viewer: DataViewer,
    key: Annotated[str, Query(min_length=1, max_length=200)],
    max_points: Annotated[int, Query(ge=100, le=5000)] = 1000,
) -> Response:
    run = db.get(Run, run_id)
    text = service.run_chart(db, run, key, max_points) if run is not None else None
    if text is None:
        raise NotFound(f"run {run_id} has no metric {key!r}")
    return _json_text(request, text)
