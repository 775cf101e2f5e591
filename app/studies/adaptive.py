"""Adaptive seeds: a study with a budget grows in stages while a sequential verdict is inconclusive.

When the last run of a stage ends, the stage is judged (``steady.server.stats.sequential``,
``steady.server.stats.sequential_tost`` and ``steady.server.stats.sequential_sources`` through the report): if
some seed-stability verdict with a ``max_std``, portability verdict with a ``margin`` or source of a sources
study is still inconclusive and the budget allows another stage, the next stage's runs (new seeds) are queued
and the study stays running; else the study completes. A sources study grows only the arms of its undecided
sources and the all-sources arm. Every stage and what it decided is recorded (``study_stages``). A time budget
(``budget.max_minutes``) ends the study before its last stage when the next stage would end past it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Literal, Protocol

from sqlalchemy.orm import Session

from steady.server.kit.db import WriteSession
from steady.server.models import Study, utcnow
from steady.server.stats.report import SeedStages
from steady.server.stats.sequential import stage_sizes
from steady.server.studies import repository
from steady.server.studies.queue import insert_runs, runs_per_seed
from steady.server.studies.schemas import StageInfo, StudySpec


class Report(Protocol):
    """What stage judging reads of a study's report (``steady.server.reports.models.Report``, a layer above
    the studies domain, so named here by its shape)."""

    @property
    def sources(self) -> Sequence[Any] | None:  # a sources study's tables (``reports.sources.SourcesTableOut``)
        ...

    def of_level(self, level: Literal["seed_stability", "stack_portability"],
                 metric: str | None = None) -> Sequence[Any]: ...


# (session, study id) -> the study's report, as ``steady.server.reports.service.compute_report`` returns it
ReportOf = Callable[[Session, int], Report]


def planned_sizes(spec: StudySpec) -> tuple:
    """Cumulative seed counts of the stages the budget allows (one stage without a budget)."""
    first = len(spec.seeds)
    if spec.budget is None:
        return (first,)
    return stage_sizes(first, spec.budget.stage_seeds or first, spec.max_seeds)


def start(session: WriteSession, study: Study, spec: StudySpec) -> None:
    """Record stage 1 (the spec's seeds) of a study with a budget."""
    if spec.budget is not None and spec.kind == "managed":
        repository.add_stage(session, study.id, 1, list(spec.seeds))


def stage_info(study: Study, stage: int, seeds: int) -> StageInfo:
    spec = StudySpec.model_validate(study.spec)
    return StageInfo(stage=stage, last_stage=len(planned_sizes(spec)), seeds=seeds, max_seeds=spec.max_seeds)


def seed_stages(session: Session, study: Study) -> SeedStages | None:
    """The stages behind an adaptive study's sequential verdicts (None: not adaptive)."""
    if not study.spec.get("budget"):
        return None
    rows = repository.stages_of(session, study.id)
    if not rows:
        return None
    spec = StudySpec.model_validate(study.spec)
    assert spec.budget is not None
    return SeedStages(stage_of_seed={s: row.stage for row in rows for s in row.seeds},
                      last_stage=len(planned_sizes(spec)), max_seeds=spec.max_seeds,
                      spending=spec.budget.spending, stopped=rows[-1].outcome == TIME_SPENT)


def stages_out(session: Session, study: Study) -> list[dict[str, Any]]:
    return [{"stage": r.stage, "seeds": list(r.seeds), "created_at": r.created_at.isoformat(),
             "judged_at": r.judged_at.isoformat() if r.judged_at else None, "outcome": r.outcome,
             "decisions": r.decisions} for r in repository.stages_of(session, study.id)]


_NUMBERS = {"seed_stability": {"n_seeds", "info_fraction", "boundary", "nominal_alpha", "cumulative_alpha", "std",
                                "lower", "upper"},
            "stack_portability": {"n_reference", "n_candidate", "info_fraction", "boundary", "nominal_alpha",
                                  "cumulative_alpha", "diff", "ci_low", "ci_high"}}
_GROUP_KEYS = {"determinism", "stack", "reference_stack", "candidate_stack"}


def _decisions(report: Report, stage: int) -> tuple[list[dict[str, Any]], bool]:
    """What ``stage`` decided per sequential verdict (seed stability, stack portability), and
    whether another stage is wanted (``steady.server.reports.models.StageDecision`` as JSON data)."""
    out, more = [], False
    for level in ("seed_stability", "stack_portability"):
        for v in report.of_level(level):
            seq = v.sequential
            if seq is None:
                continue
            looks = seq.stages
            look = next((x for x in looks if x.stage == stage), looks[-1] if looks else None)
            numbers = look.model_dump(mode="json", include=_NUMBERS[level]) if look else {}
            group = {k: x for k, x in v.group.as_dict().items() if k in _GROUP_KEYS}  # not e.g. `differ_by`
            out.append({"level": level, "metric": v.metric, **group, "verdict": v.verdict,
                        "decided_at": seq.decided_at, **numbers,
                        "decision": look.verdict if look and look.stage == stage else v.verdict})
            more = more or (v.verdict == "inconclusive" and not seq.final)
    return out, more


def _source_decisions(report: Report, stage: int) -> tuple[list[dict[str, Any]], set[str]]:
    """What ``stage`` decided per source and metric of a sources study (its group-sequential TOST against the
    all-sources arm), and the source arms that are still inconclusive with stages to come."""
    out, grow = [], set()
    for table in report.sources or ():
        for row in table.rows:
            seq = row.sequential
            if seq is None:
                continue
            look = next((x for x in seq.looks if x.stage == stage), seq.looks[-1] if seq.looks else None)
            numbers = {} if look is None else {
                "n_candidate": look.n_source, "n_reference": look.n_all, "info_fraction": look.info_fraction,
                "boundary": look.boundary, "nominal_alpha": look.nominal_alpha,
                "cumulative_alpha": look.cumulative_alpha, "ratio": look.ratio, "lower": look.lower,
                "upper": look.upper}
            out.append({"level": "sources", "metric": table.metric, "candidate_stack": row.source,
                        "reference_stack": "all", "verdict": seq.verdict, "decided_at": seq.decided_at, **numbers,
                        "decision": look.verdict if look and look.stage == stage else seq.verdict})
            if seq.verdict == "inconclusive" and not seq.final:
                grow.add(row.source)
    return out, grow


TIME_SPENT = "time_spent"  # a stage's outcome when the time budget ended the study before its last stage


def over_time(session: Session, study: Study, spec: StudySpec, rows: Sequence[Any], n_next: int,
              now: datetime) -> bool:
    """Would a next stage of ``n_next`` runs end past the budget's ``max_minutes``? Its pace is the stage just
    ended: that stage's wall time (from its queueing to ``now``) per run, times ``n_next``, counted from the first
    stage's start. False without a time budget."""
    assert spec.budget is not None
    if spec.budget.max_minutes is None:
        return False
    current = rows[-1]
    n_current = max(repository.runs_of_seeds(session, study.id, current.seeds), 1)
    per_run = (now - current.created_at).total_seconds() / n_current
    ends = (now - rows[0].created_at).total_seconds() + per_run * n_next
    return ends > 60.0 * spec.budget.max_minutes


def next_seeds(used: set[int], n_new: int, *, start: int) -> list[int]:
    """The ``n_new`` smallest seeds from ``start`` on that no stage used yet (``start``: the spec's smallest
    seed, so a study that begins at seed 1000 stays clear of one that begins at 0)."""
    seeds: list[int] = []
    candidate = start
    while len(seeds) < n_new:
        if candidate not in used:
            seeds.append(candidate)
        candidate += 1
    return seeds


def judge_stage(session: WriteSession, study: Study, report_of: ReportOf | None) -> bool:
    """The study's current stage has settled: record its decisions; True when a next stage was queued.

    ``report_of`` computes the study's report (``steady.server.reports.service.compute_report``): the caller
    passes it, as the reports domain builds on this one. None is refused when a stage waits to
    be judged.
    """
    if not study.spec.get("budget") or study.kind != "managed":
        return False
    rows = repository.stages_of(session, study.id)
    if not rows or rows[-1].judged_at is not None:
        return False
    current = rows[-1]
    if report_of is None:
        raise ValueError(f"study {study.id}: stage {current.stage} has settled and needs its report to be judged")
    spec = StudySpec.model_validate(study.spec)
    sizes = planned_sizes(spec)
    try:
        report = report_of(session, study.id)
    except ValueError as exc:  # data the stats core cannot judge: no reason to spend more seeds
        current.decisions, current.outcome, current.judged_at = [{"error": str(exc)}], "budget_spent", utcnow()
        return False
    decisions, more = _decisions(report, current.stage)
    by_source, grow = _source_decisions(report, current.stage)
    decisions += by_source
    current.decisions, current.judged_at = decisions, utcnow()
    # a sources study grows only its undecided sources' arms and the all-sources arm, unless another
    # sequential verdict (a max_std, a margin) wants every arm
    groups = None if more or not grow else [*sorted(grow), "all"]
    more = more or bool(grow)
    if not more or current.stage >= len(sizes):
        current.outcome = "budget_spent" if more or any(d["verdict"] == "inconclusive" for d in decisions) \
            else "conclusive"
        session.flush()
        return False
    used = {s for r in rows for s in r.seeds}
    seeds = next_seeds(used, sizes[current.stage] - len(used), start=min(spec.seeds))
    if over_time(session, study, spec, rows, len(seeds) * runs_per_seed(spec, groups), utcnow()):
        current.outcome = TIME_SPENT  # no next stage: its looks are dropped and their error is left unspent
        session.flush()
        return False
    current.outcome = "continue"
    repository.add_stage(session, study.id, current.stage + 1, seeds)
    insert_runs(session, study, spec, seeds, groups=groups)
    study.updated_at = utcnow()
    session.flush()
    return True
