"""The fleet page: every worker × the recent fleet checks (its verdict in each), quarantined workers and
workers whose runs parted from their peers' in red, and the history of those (or of the one asked for)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import select

from steady.server.alerts import quarantine
from steady.server.dashboard.access import PageViewer
from steady.server.dashboard.views import render
from steady.server.kit.deps import ReadDB
from steady.server.models import Study, Worker, WorkerEvent

router = APIRouter(include_in_schema=False)

CHECKS_SHOWN = 12
HISTORY_SHOWN = 20


@dataclass(frozen=True)
class Cell:
    """One worker's result in one check, as the page says it."""

    text: str
    tone: str  # good | bad | unknown | none
    title: str


def cell(event: WorkerEvent | None) -> Cell:
    if event is None:
        return Cell("not in this check", "none", "this worker ran no run of this check")
    details = event.details or {}
    if event.verdict == quarantine.FAULTY:
        step = "" if event.first_divergent_step is None else f" from step {event.first_divergent_step}"
        of = f"{details['parted']} of {details['runs']} runs" if "parted" in details and "runs" in details \
            else "its runs"
        return Cell(f"parts{step}", "bad", f"{of} part from its peers' majority{step}")
    if event.verdict == quarantine.SLOW:
        ratio = details.get("ratio")
        times = f" ({ratio:.3g}× its peers' step time)" if isinstance(ratio, int | float) else ""
        return Cell(f"slow{times}", "bad", f"markedly slower than its peers{times}")
    if event.verdict == quarantine.AGREES:
        return Cell("agrees", "good", "its runs equal its peers' majority")
    if event.verdict == quarantine.NO_RUNS:
        why = f": {details['reason']}" if details.get("reason") else ""
        return Cell("ran no run", "unknown", f"it completed no run of this check{why}")
    if event.verdict == quarantine.NO_MAJORITY:
        return Cell("no majority", "unknown", "its stack group had no majority result to compare with")
    words = (event.verdict or "no verdict").replace("_", " ")
    return Cell(words, "unknown", words)


def event_line(e: WorkerEvent, studies: dict[int, str]) -> str:
    """One line of a worker's history, in words."""
    if e.kind == quarantine.CHECK:
        if e.study_id is None:
            what = "a fleet check (its study was deleted since)"
        else:
            name = studies.get(e.study_id)
            what = f"fleet check {name} (study {e.study_id})" if name else f"fleet check, study {e.study_id}"
        return f"{what}: {cell(e).title}"
    who = f"by {e.actor}" if e.actor else ""
    why = f": {e.reason}" if e.reason else ""
    return f"{e.kind} {who}{why}".strip()


def _tone(e: WorkerEvent) -> str:
    if e.kind == quarantine.CHECK:
        return cell(e).tone
    return "bad" if e.kind == quarantine.QUARANTINED else "good"


@router.get("/fleet", response_class=HTMLResponse)
def fleet_page(request: Request, db: ReadDB, viewer: PageViewer,
               worker: Annotated[int | None, Query(ge=1, description="show this worker's history")] = None,
               ) -> HTMLResponse:
    workers = list(db.scalars(select(Worker).order_by(Worker.name, Worker.id)))
    study_ids, events = quarantine.recent_checks(db, studies=CHECKS_SHOWN)
    studies = {s.id: s for s in db.scalars(select(Study).where(Study.id.in_(study_ids)))} if study_ids else {}
    result: dict[tuple[int, int], WorkerEvent] = {(e.worker_id, int(e.study_id or 0)): e for e in events}
    rows: list[dict[str, Any]] = []
    for w in workers:
        cells = [cell(result.get((w.id, sid))) for sid in study_ids]
        latest = next((c for c in cells if c.tone != "none"), None)
        rows.append(dict(worker=w, cells=cells, quarantined=w.quarantined_at is not None,
                     faulty=latest is not None and latest.tone == "bad"))
    flagged = [r["worker"] for r in rows if r["quarantined"] or r["faulty"] or r["worker"].id == worker]
    names = {sid: s.name for sid, s in studies.items()}
    histories = []
    for w in flagged:
        evs, total = quarantine.history(db, w.id, limit=HISTORY_SHOWN, offset=0)
        histories.append(dict(worker=w, total=total,
                              events=[dict(at=e.at, kind=e.kind, line=event_line(e, names),
                                           tone=_tone(e))
                                      for e in evs]))
    checks = [dict(id=sid, name=studies[sid].name if sid in studies else f"study {sid}",
                   at=studies[sid].created_at if sid in studies else None) for sid in study_ids]
    return render(request, "fleet.html", viewer, rows=rows, checks=checks, histories=histories,
                  quarantined=sum(1 for r in rows if r["quarantined"]))
