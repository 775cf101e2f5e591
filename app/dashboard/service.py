"""What the dashboard pages show: studies with verdict badges, a study's state, runs, workers.

Reports are expensive (every series of every completed run), so they are cached per process,
keyed by the study's *version*: its status, run counts, last finish time and newest metric
chunk. A report is only computed for a study that has no queued or running runs; the studies
list shows cached badges at once and fetches the missing ones afterwards.
"""

from __future__ import annotations

import importlib.util
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from steady.server.dashboard import charts
from steady.server.metrics import repository as metrics_repo
from steady.server.models import Run, Study
from steady.server.runs import repository as runs_repo
from steady.server.reports import service as reports
from steady.server.reports.models import Report
from steady.server.stats.vocabulary import DETERMINISM_LEVELS, LEVEL_TITLES, LEVELS, severity
from steady.server.studies import adaptive
from steady.server.studies import repository as studies_repo
from steady.server.studies.schemas import Progress, StudySpec
from steady.worker.contract.protocol import STEP_TIME_KEYS, RunStatus

# A level's badge is the worst verdict among its metrics and groups (steady.server.stats.vocabulary.severity).
TONE = {3: "bad", 2: "unknown", 1: "ok", 0: "good"}
# Runs drawn in a group's chart: finished with data, or still logging it.
CHARTED_RUN_STATUSES = (RunStatus.completed.value, RunStatus.running.value)


class _LRU:
    """A small thread-safe LRU map shared by the requests of one server process."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def get_or_compute(self, key: Any, compute: Callable[[], Any]) -> Any:
        value = self.get(key)
        if value is None:
            value = compute()
            self.put(key, value)
        return value


_reports = _LRU(64)
_charts = _LRU(128)


# --- versions ------------------------------------------------------------------------------


def study_versions(session: Session, studies: Sequence[Study]) -> dict[int, tuple]:
    """A value that changes whenever anything a report or chart reads changes."""
    ids = [s.id for s in studies]
    if not ids:
        return {}
    progress = studies_repo.progress_by_study(session, ids)
    finished, chunks = runs_repo.last_changes(session, ids)
    out = {}
    for s in studies:
        p = progress[s.id]
        stamp = finished.get(s.id)
        out[s.id] = (s.status, s.updated_at.isoformat() if s.updated_at else None, p.total, p.queued, p.running,
                     p.completed, p.failed, p.cancelled, stamp.isoformat() if stamp else None, chunks.get(s.id))
    return out


def version_tag(version: tuple) -> str:
    return "|".join("" if v is None else str(v) for v in version)


def is_settled(progress: Progress) -> bool:
    """No run queued or executing, and at least one finished: the report will not move."""
    return progress.queued == 0 and progress.running == 0 and progress.completed > 0


# --- reports and badges ----------------------------------------------------------------------


def _report_key(db_key: str, study: Study, version: tuple) -> tuple:
    # A report reads completed runs only: new points of running runs (the last item) do not change it.
    return db_key, study.id, version[:-1]


def report(session: Session, study: Study, version: tuple, db_key: str) -> Report:
    return _reports.get_or_compute(_report_key(db_key, study, version),
                                   lambda: reports.study_report(session, study.id))


def cached_report(study: Study, version: tuple, db_key: str) -> Report | None:
    return _reports.get(_report_key(db_key, study, version))


def progress_of(session: Session, study: Study) -> Progress:
    return studies_repo.progress_by_study(session, [study.id])[study.id]


@dataclass(frozen=True)
class Badge:
    level: str
    title: str
    verdict: str
    tone: str
    count: int  # verdicts behind it
    hint: str = ""  # the tooltip: what the badge sums up

    def as_dict(self) -> dict[str, Any]:
        return {"level": self.level, "title": self.title, "verdict": self.verdict, "tone": self.tone,
                "count": self.count, "hint": self.hint or f"worst of {self.count} verdict(s)"}


def repeatability_badge(report_: Report) -> Badge:
    """Did every determinism level meet its expectation (``steady.server.stats.expectations``)?

    Not the worst verdict: at ``none`` a built-in's repeats are expected to differ (user code may
    seed itself there), and runs of different seeds that are identical are the suspicious case."""
    head = report_.headline
    title = LEVEL_TITLES["repeatability"]
    if not head:
        return Badge("repeatability", title, "n/a", "none", 0)
    parts = []
    for h in head:
        mark = {True: "met", False: "NOT met", None: "inconclusive"}[h.met]
        parts.append(f"{h.determinism}: expected {h.expected} — {mark}" + (f" ({h.phrase})" if h.met is False else ""))
    hint = "; ".join(parts + [s for h in head for s in h.suspicious] + _compared_hints(report_))
    count = sum(h.n_verdicts for h in head)
    if any(h.suspicious for h in head):
        return Badge("repeatability", title, "suspicious", "bad", count, hint)
    if any(h.met is False for h in head):
        return Badge("repeatability", title, "expectation missed", "bad", count, hint)
    if all(h.met is None for h in head):
        return Badge("repeatability", title, "inconclusive", "unknown", count, hint)
    return Badge("repeatability", title, "met expectations", "good", count, hint)


def _compared_hints(report_: Report) -> list[str]:
    """What the repeats were compared on, once per distinct wording: "values compared at the 2 printed
    decimals (…)"; the digests compared or missing (``steady.server.stats.resolution``)."""
    out: list[str] = []
    for v in report_.of_level("repeatability"):
        c = v.compared
        if c is None:
            continue
        text = f"values compared {c.values}" + (f"; {c.digest_phrase}" if c.digest_phrase else "")
        if text not in out:
            out.append(text)
    return out


OUTCOME_TONE = {"pass": "good", "fail": "bad", "inconclusive": "unknown"}
BADGE_COLUMNS = ("outcome", *LEVELS)  # the studies list's badge columns, in the order ``badges`` gives them
BADGE_TITLES: dict[str, str] = {"outcome": "Outcome", **{str(k): v for k, v in LEVEL_TITLES.items()}}


def outcome_badge(report_: Report) -> Badge:
    """The study's judgment as the report states it (``Report.outcome``: the one policy ``steady report``,
    ``submit --wait`` and ``check`` exit by), its reason in the tooltip."""
    out = report_.outcome
    return Badge("outcome", BADGE_TITLES["outcome"], {"pass": "passed", "fail": "failed"}.get(out.status, out.status),
                 OUTCOME_TONE[out.status], sum(c.status != "not_asked" for c in out.checks), out.reason)


def badges(report_: Report) -> list[Badge]:
    """The outcome, then one badge per level."""
    out = [outcome_badge(report_)]
    for level in LEVELS:
        if level == "repeatability":
            out.append(repeatability_badge(report_))
            continue
        verdicts = [v.verdict for v in report_.of_level(level)]
        if not verdicts:
            out.append(Badge(level, LEVEL_TITLES[level], "n/a", "none", 0))
            continue
        worst = max(verdicts, key=severity)
        out.append(Badge(level, LEVEL_TITLES[level], worst, TONE[severity(worst)], len(verdicts)))
    return out


def tone(verdict: str) -> str:
    return TONE[severity(verdict)]


# --- the studies list ------------------------------------------------------------------------


@dataclass
class StudyRow:
    study: Study
    progress: Progress
    version: str
    settled: bool
    badges: list[Badge] | None  # None: not computed yet (or the study is still running)


def studies_page(session: Session, db_key: str, *, status: str | None, name: str | None, page: int,
                 per_page: int) -> tuple[list[StudyRow], int]:
    rows, total = studies_repo.list_studies(session, status=status, suite=None, name=name, limit=per_page,
                                            offset=(page - 1) * per_page)
    versions = study_versions(session, rows)
    progress = studies_repo.progress_by_study(session, [s.id for s in rows])
    out = []
    for s in rows:
        settled = is_settled(progress[s.id])
        cached = cached_report(s, versions[s.id], db_key) if settled else None
        out.append(StudyRow(s, progress[s.id], version_tag(versions[s.id]), settled,
                            badges(cached) if cached is not None else None))
    return out, total


def badges_for(session: Session, db_key: str, study_ids: Sequence[int]) -> dict[int, list[dict[str, Any]] | None]:
    studies = list(session.scalars(select(Study).where(Study.id.in_(list(study_ids)))))
    versions = study_versions(session, studies)
    progress = studies_repo.progress_by_study(session, [s.id for s in studies])
    out: dict[int, list[dict[str, Any]] | None] = {}
    for s in studies:
        if not is_settled(progress[s.id]):
            out[s.id] = None
            continue
        out[s.id] = [b.as_dict() for b in badges(report(session, s, versions[s.id], db_key))]
    return out


# --- one study -------------------------------------------------------------------------------


def study_groups(session: Session, study_id: int) -> list[tuple[str, str]]:
    """The (determinism, stack) pairs that have runs, in the report's order."""
    pairs = runs_repo.groups_with_runs(session, study_id)
    return sorted(set(pairs), key=lambda p: (DETERMINISM_LEVELS.index(p[0])
                                                             if p[0] in DETERMINISM_LEVELS else 9, p[1]))


# The chart opens on the level that answers a study's question (seeded: how wide is the seed
# band?), then strict, and the noisiest (none) last.
CHART_LEVEL_ORDER = ("seeded", "strict", "none")


def chart_levels(groups: Sequence[tuple[str, str]]) -> list[str]:
    present = list(dict.fromkeys(d for d, _ in groups))
    return sorted(present, key=lambda d: CHART_LEVEL_ORDER.index(d) if d in CHART_LEVEL_ORDER else 9)


def study_runs(session: Session, study_id: int, *, limit: int, offset: int) -> tuple[list[Run], int]:
    return runs_repo.list_runs(session, study_id, status=None, limit=limit, offset=offset)


def first_divergent_step(report_: Report | None, metric: str, determinism: str, stack: str) -> int | None:
    if report_ is None:
        return None
    for v in report_.of_level("repeatability", metric):
        if v.group.determinism == determinism and v.group.stack == stack:
            return v.first_divergent_step
    return None


def group_chart(session: Session, study: Study, version: tuple, db_key: str, *, metric: str, determinism: str,
                stack: str, max_points: int, max_lines: int) -> str:
    def compute() -> str:
        runs = runs_repo.group_runs(session, study.id, determinism, stack, CHARTED_RUN_STATUSES)
        settled = is_settled(studies_repo.progress_by_study(session, [study.id])[study.id])
        rep = report(session, study, version, db_key) if settled else cached_report(study, version, db_key)
        # A settled study's band is the report's (when this process computed it): only the runs
        # drawn as lines are loaded then, not every series of the group.
        band = reports.report_band(session, study.id, metric=metric, determinism=determinism,
                                   stack=stack) if settled else None
        n_with_data = None
        ids = [r.id for r in runs]
        if band is not None:
            has = metrics_repo.runs_with_key(session, ids, metric)
            n_with_data = len(has)
            ids = [r.id for r in charts.pick_lines([r for r in runs if r.id in has], max_lines)]
        loaded = metrics_repo.load_series_shared(session, ids, [metric])
        series = {run_id: sv for (run_id, _), sv in loaded.items()}
        return charts.group_chart(
            runs, series, metric=metric, coverage=study.spec.get("coverage", 0.9),
            confidence=study.spec.get("confidence", 0.95), max_points=max_points, max_lines=max_lines,
            first_divergent_step=first_divergent_step(rep, metric, determinism, stack),
            band=band, n_runs_with_data=n_with_data,
        )

    key = (db_key, study.id, version, metric, determinism, stack, max_points, max_lines)
    return _charts.get_or_compute(key, compute)


def difference_chart(session: Session, study: Study, version: tuple, db_key: str, *, metric: str, determinism: str,
                     stack: str, unit: str, max_points: int) -> str:
    """Each repeat minus its seed's reference repeat (absolute or in ULPs of the logged dtype)."""
    def compute() -> str:
        runs = runs_repo.group_runs(session, study.id, determinism, stack, CHARTED_RUN_STATUSES)
        ids = [r.id for r in runs]
        loaded = metrics_repo.load_series(session, ids, [metric])
        series = {run_id: sv for (run_id, _), sv in loaded.items()}
        dtypes = {run_id: dtype for (run_id, _), dtype in metrics_repo.load_dtypes(session, ids, [metric]).items()}
        printed = {run_id: r for (run_id, _), r in metrics_repo.load_resolutions(session, ids, [metric]).items()}
        return charts.difference_chart(runs, series, dtypes, metric=metric, unit=unit, max_points=max_points,
                                       resolutions=printed)

    key = ("difference", db_key, study.id, version, metric, determinism, stack, unit, max_points)
    return _charts.get_or_compute(key, compute)


def cost_scale(report_: Report | None) -> float:
    """The right end of the cost chart's axis: the largest ratio or CI bound, and at least 1×."""
    values = [1.0]
    for c in report_.determinism_cost if report_ is not None else []:
        values += [v for v in (c.ratio, c.ci_high) if v is not None and math.isfinite(v)]
    return max(values) * 1.15


def study_metrics(study: Study) -> list[str]:
    return [m["name"] for m in study.spec.get("metrics", [])]


def repeat_partners(session: Session, run: Run, limit: int = 5) -> list[Run]:
    """The run's repeats: the study's other runs of its seed, determinism and stack."""
    return list(session.scalars(select(Run).where(
        Run.study_id == run.study_id, Run.seed == run.seed, Run.determinism == run.determinism,
        Run.stack == run.stack, Run.id != run.id).order_by(Run.id).limit(limit)))


def run_keys(session: Session, run: Run) -> list[str]:
    keys = metrics_repo.metric_keys(session, [run.id]).get(run.id, [])
    # The judged metrics first, step time last.
    return sorted(keys, key=lambda k: (k in STEP_TIME_KEYS, k))


def run_chart(session: Session, run: Run, key: str, max_points: int) -> str | None:
    series = metrics_repo.load_series(session, [run.id], [key]).get((run.id, key))
    if series is None:
        return None
    return charts.run_chart(series[0], series[1], key=key, max_points=max_points)


# --- alerts (steady.server.alerts is optional: another package may not be installed yet) ---------------


def alerts_available() -> bool:
    return importlib.util.find_spec("steady.server.alerts") is not None and importlib.util.find_spec(
        "steady.server.alerts.repository") is not None


def list_alerts(session: Session, limit: int = 200) -> tuple[list[Any], list[Any]]:
    """(firing, resolved) alerts, newest first. Call only when ``alerts_available()``."""
    from steady.server.alerts import repository as alerts_repo

    def of(state: str) -> list[Any]:
        rows, _ = alerts_repo.list_alerts(session, state=state, study_id=None, suite=None, rule_id=None, kind=None,
                                          limit=limit, offset=0)
        return rows

    return of("firing"), of("resolved")


def study_stages(session: Session, study: Study) -> dict[str, Any] | None:
    """An adaptive study's stages (``steady.server.studies.adaptive``) with its design; None for other studies."""
    if not study.spec.get("budget"):
        return None
    rows = adaptive.stages_out(session, study)
    if not rows:
        return None
    spec = StudySpec.model_validate(study.spec)
    assert spec.budget is not None  # the spec has a budget: checked above
    return {"rows": rows, "last_stage": len(adaptive.planned_sizes(spec)), "max_seeds": spec.max_seeds,
            "spending": {"pocock": "Pocock-type", "obrien_fleming": "O'Brien–Fleming-type"}[spec.budget.spending]}
