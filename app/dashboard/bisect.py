"""The page of a bisect (``steady bisect``): its points in history order, each one's study and the verdict of the
bisected check, the order the search judged them in, and where the change lies by what was decided.

A bisect has no table of its own: its studies carry it in their name (``… (bisect GOOD..BAD)``) and their
description (``steady bisect GOOD..BAD (PROPERTY): point N of M, commit SHA``, ``… stack NAME`` or ``… version
PACKAGE==VERSION``), both written
by the CLI."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import select

from steady.server.dashboard import service
from steady.server.dashboard.access import PageViewer
from steady.server.dashboard.views import db_key, not_found, render
from steady.server.kit.deps import ReadDB
from steady.server.lifecycle import localizing
from steady.server.models import Study
from steady.server.reports import localizations
from steady.server.stats.bisect import checks_per_point, decide_point, wrong_point_bound
from steady.server.studies import repository as studies_repo

router = APIRouter(include_in_schema=False)

# --property → the report check that decides a point (as steady.server.cli.bisect.PROPERTIES)
CHECK_OF = {"repeatability": "repeatability", "seed-stability": "seed_stability", "tost": "stack_portability",
            "cost": "determinism_cost", "convergence": "convergence"}
DESCRIPTION = re.compile(r"^steady bisect (?P<span>\S+) \((?P<prop>[a-z-]+)\): point (?P<point>\d+) of (?P<last>\d+), "
                         r"(?P<what>commit|stack|version) (?P<sha>\S+)$")
SPAN = r"^[A-Za-z0-9_.:+\-]{1,100}\.\.[A-Za-z0-9_.:+\-]{1,100}$"  # GOOD..BAD: 7-digit shas or stack names
TONE = {"good": "good", "bad": "bad", "undecided": "unknown", "skipped": "none", "running": "none"}
MAX_POINTS = 500


def _point(db: Any, request: Request, study: Study, kind: str, prop: str = "") -> tuple[str, str]:
    """(state, the deciding check's plain line) of one point's study."""
    if study.status == "failed":
        return "skipped", study.status_reason or "its runs failed"
    if study.status in ("queued", "running"):
        return "running", f"study {study.status}"
    if study.status == "cancelled":
        return "undecided", "the study was cancelled"
    version = service.study_versions(db, [study])[study.id]
    report = service.report(db, study, version, db_key(request))
    progress = studies_repo.progress_by_study(db, [study.id])[study.id]
    decided = decide_point([(c.status, c.summary) for c in report.outcome.checks
                            if c.kind == kind and c.status != "not_asked"],
                           failed=progress.failed, runs=progress.completed + progress.failed, prop=prop or kind)
    return decided if decided is not None else ("undecided", report.outcome.reason)


@router.get("/bisects/{span}", response_class=HTMLResponse)
def bisect_page(request: Request, db: ReadDB, viewer: PageViewer,
                span: Annotated[str, Path(pattern=SPAN)]) -> HTMLResponse:
    studies = list(db.scalars(select(Study).where(Study.name.endswith(f" (bisect {span})", autoescape=True))
                              .order_by(Study.id).limit(MAX_POINTS)))
    rows: list[dict[str, Any]] = []
    prop, last = "", 0
    for order, s in enumerate(studies, start=1):
        m = DESCRIPTION.match(str((s.spec or {}).get("description", "")))
        if m is None or m["span"] != span or m["prop"] not in CHECK_OF:
            continue
        prop, last = m["prop"], int(m["last"])
        state, why = _point(db, request, s, CHECK_OF[m["prop"]], m["prop"])
        short = {"commit": m["sha"][:10], "version": m["sha"].replace("==", " ")}.get(m["what"], m["sha"])
        rows.append(dict(point=int(m["point"]), sha=short, what=m["what"], study=s, order=order, state=state,
                         tone=TONE[state], why=why, alpha=_point_level(s.spec or {}, CHECK_OF[m["prop"]])))
    if not rows:
        return not_found(request, viewer, f"bisect {span}")
    rows.sort(key=lambda r: (r["point"], r["order"]))
    goods = [r["point"] for r in rows if r["state"] == "good"]
    bads = [r["point"] for r in rows if r["state"] == "bad"]
    low = max((p for p in goods if not bads or p < min(bads)), default=None)
    high = min(bads, default=None)
    found = low is not None and high is not None and high - low == 1
    first_bad = next((r for r in rows if r["point"] == high), None) if found else None
    localized = _localization(db, first_bad["study"]) if first_bad and prop == "repeatability" else None
    return render(request, "bisect.html", viewer, span=span, prop=prop, last=last, rows=rows, low=low, high=high,
                  first_bad=first_bad, judged=len(rows), level=_level(rows, prop), localized=localized)


def _localization(db: Any, study: Study) -> str | None:
    """The first bad point's first divergent op, as `steady bisect` asked a worker for it: the newest answer kept
    with the study's verdict, else its newest localization job's state, else why none can be asked (a framework
    whose ops are not hooked); None when nothing is known."""
    kept = localizations.of_study(study)
    if kept:
        return f"runs {kept[-1].run_ids[0]} and {kept[-1].run_ids[1]}: {kept[-1].sentence}"
    for job in localizing.recent_jobs(db, study.id, limit=1):
        pair = f"runs {job.run_a} and {job.run_b}"
        if job.status in ("pending", "running"):
            return f"{pair}: localization job {job.id} is {job.status}"
        return f"no op named ({pair}, localization job {job.id} {job.status}): {job.error or 'no answer kept'}"
    framework = str(((study.spec or {}).get("workload") or {}).get("framework", ""))
    if framework and framework not in localizing.REPLAYABLE:
        return f"no op named: {localizing.NOT_REPLAYABLE}; this study's framework is {framework!r}"
    return None


def _point_level(spec: dict[str, Any], kind: str) -> float | None:
    """A point's level: its study's ``alpha`` (set by the CLI from its plan) times the study's checks of the kind."""
    alpha = spec.get("alpha")
    return None if alpha is None else float(alpha) * checks_per_point(kind, spec)


def _level(rows: list[dict[str, Any]], prop: str) -> dict[str, Any] | None:
    """The points' level (each study's ``alpha`` over its checks, as the CLI sets it from its plan) and the chance
    that the answer is wrong, m·α for the m points decided (``steady.server.stats.bisect.wrong_point_bound``);
    None for repeatability (exact claims) or when the points do not share one level."""
    levels = {r["alpha"] for r in rows}
    if prop == "repeatability" or len(levels) != 1 or None in levels:
        return None
    alpha = levels.pop()
    decided = sum(r["state"] in ("good", "bad") for r in rows)
    return {"alpha": f"{alpha * 100:.3g}%", "decided": decided,
            "bound": f"{wrong_point_bound(decided, alpha) * 100:.3g}%"}
