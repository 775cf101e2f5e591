"""A fleet check's section of the report: facts only (``steady.server.stats.fleet`` computes them; the checks in
``steady.server.reports.outcome`` and the terminal's ``steady.server.cli.render`` put them in words).

Per fingerprint group: its workers, whether a majority result exists, and each worker whose runs part from
it (first step, repeats parted, consistent or intermittent); the workers markedly slower than their group's
others (step time, not numerics); the workers of the pool that ran no run (and why); what the check could
have missed (an intermittent fault's rate seen with probability 0.95, and the probability of seeing a few
rates); and, between fingerprint groups, the TOST of the final value against the largest group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from steady.server.reports.parts import Part
from steady.server.stats import fleet as fleet_stats
from steady.server.stats.report_data import RunData
from steady.server.kit.wire import WireFloat
from steady.worker.contract.protocol import STEP_TIME_KEYS

POWER = 0.95
SHOWN_RATES = (100, 1_000, 10_000)  # "a fault in 1 of K steps": the Ks every report states
TOST_ALPHA = 0.05


class FleetFinding(Part):
    """A worker whose runs part, bit for bit, from its fingerprint group's majority result."""

    worker: str
    group: str
    runs: int
    parted: int
    kind: Literal["consistent", "intermittent"]  # consistent: every run parts, all alike
    first_step: int | None  # the earliest step a run of it parts at (None: only a digest parts)
    metric: str | None
    digests: list[str]  # digest kinds that part (final_weights, optimizer_state, initial_weights)
    run_ids: list[int]


class FleetSlow(Part):
    """A worker markedly slower than its group's other workers: step time, not numerics."""

    worker: str
    group: str
    ratio: WireFloat
    median_s: WireFloat
    others_median_s: WireFloat
    p_value: WireFloat
    threshold: WireFloat


class FleetGroupOut(Part):
    group: str  # a short digest of the stack fingerprint
    stack: str  # the fingerprint in a few words (framework, CPU or GPU)
    workers: list[str]
    runs: int
    majority_runs: int
    has_majority: bool
    steps_per_run: int
    findings: list[FleetFinding]


class FleetMissing(Part):
    """A worker of the pool with fewer completed runs than asked, and the reason its runs gave."""

    worker: str
    asked: int
    completed: int
    reason: str | None


class FleetRate(Part):
    one_in: int  # a fault striking 1 step in this many
    probability: WireFloat  # that the check saw it on a worker


class FleetSensitivity(Part):
    """What the check could have missed, per worker: repeats × steps of its runs (the fewest in the pool)."""

    repeats: int
    steps_per_run: int
    steps_per_worker: int
    power: WireFloat
    one_in_seen: int | None  # the rarest fault (1 step in this many) seen with probability ``power``
    rates: list[FleetRate]
    plan_one_in: int | None = None
    plan_repeats: int | None = None  # repeats per worker for plan_one_in at ``power``


class FleetAcross(Part):
    """A fingerprint group's final values against the largest group's: TOST, not bits (stacks differ)."""

    reference_group: str
    candidate_group: str
    metric: str
    margin: WireFloat | None
    verdict: Literal["equivalent", "not_equivalent", "inconclusive", "not_asked"]
    diff: WireFloat | None = None
    p_value: WireFloat | None = None
    alpha: WireFloat = TOST_ALPHA


class FleetReport(Part):
    pool: list[str]
    metric: str  # the per-step values compared bit for bit (with the digests); the first metric of the spec
    groups: list[FleetGroupOut]
    slow: list[FleetSlow]
    slow_ratio: WireFloat
    alpha: WireFloat
    missing: list[FleetMissing]
    sensitivity: FleetSensitivity | None
    across: list[FleetAcross]


def _stack_words(fp: Mapping[str, Any]) -> str:
    parts = [f"{fp.get('framework', 'framework')} {fp.get('framework_version', '')}".strip()]
    parts.append(str(fp.get("gpu_model") or fp.get("cpu_model") or "unknown device"))
    return ", ".join(p for p in parts if p)


def fleet_section(fleet: Mapping[str, Any], runs: Sequence[Any], data: Sequence[RunData], metrics: Sequence[str],
                  margins: Mapping[str, float | None]) -> FleetReport:
    """The fleet section from the study's spec ``fleet`` part, its runs (all of them, for the missing ones),
    the judged runs' data and the metrics judged (per-step values compared bit for bit)."""
    pool = [dict(w) for w in fleet.get("pool") or []]
    names = {int(w["id"]): str(w["name"]) for w in pool}
    repeats = int(fleet.get("repeats", 1))
    fleet_runs: list[fleet_stats.FleetRun] = []
    fingerprints: dict[str, Mapping[str, Any]] = {}
    for d in data:
        name = names.get(int(d.worker)) if d.worker is not None else None
        if name is None:
            continue
        group = fleet_stats.fingerprint_key(d.fingerprint)
        fingerprints.setdefault(group, d.fingerprint)
        times = next((d.series[k][1] for k in STEP_TIME_KEYS if k in d.series), np.empty(0))
        fleet_runs.append(fleet_stats.FleetRun(
            run_id=d.run_id, worker=name, group=group, digests=dict(d.digests),
            series={k: d.series[k] for k in metrics if k in d.series}, step_times=np.asarray(times)))
    result = fleet_stats.fleet_check(fleet_runs, slow_ratio=float(fleet.get("slow_ratio", 5.0)))
    groups = [FleetGroupOut(
        group=g.group, stack=_stack_words(fingerprints[g.group]), workers=list(g.workers), runs=g.runs,
        majority_runs=g.majority_runs, has_majority=g.has_majority, steps_per_run=g.steps_per_run,
        findings=[FleetFinding(worker=f.worker, group=f.group, runs=f.runs, parted=f.parted,
                               kind="consistent" if f.consistent else "intermittent", first_step=f.first_step,
                               metric=f.metric, digests=list(f.digests), run_ids=list(f.run_ids))
                  for f in g.findings],
    ) for g in result.groups]
    slow = [FleetSlow(worker=s.worker, group=s.group, ratio=s.ratio, median_s=s.median_s,
                      others_median_s=s.others_median_s, p_value=s.p_value, threshold=s.threshold)
            for s in result.slow]
    return FleetReport(pool=[str(w["name"]) for w in pool], metric=metrics[0] if metrics else "",
                       groups=groups, slow=slow, slow_ratio=result.slow_ratio, alpha=result.alpha,
                       missing=_missing(pool, runs, repeats),
                       sensitivity=_sensitivity(result, fleet_runs, repeats, fleet.get("plan_one_in")),
                       across=_across(fleet_runs, result, metrics[0] if metrics else None, margins))


def _missing(pool: list[dict[str, Any]], runs: Sequence[Any], repeats: int) -> list[FleetMissing]:
    out = []
    for w in pool:
        mine = [r for r in runs if r.pinned_worker == int(w["id"])]
        done = [r for r in mine if r.status == "completed"]
        if len(done) >= repeats:
            continue
        reason = next((r.error for r in mine if r.status == "failed" and r.error), None)
        out.append(FleetMissing(worker=str(w["name"]), asked=repeats, completed=len(done), reason=reason))
    return out


def _sensitivity(result: fleet_stats.FleetResult, runs: Sequence[fleet_stats.FleetRun], repeats: int,
                 plan_one_in: int | None) -> FleetSensitivity | None:
    steps = min((g.steps_per_run for g in result.groups), default=0)
    if not runs or steps < 1:
        return None
    n = repeats * steps
    rate = fleet_stats.rate_seen(n, POWER)
    return FleetSensitivity(
        repeats=repeats, steps_per_run=steps, steps_per_worker=n, power=POWER,
        one_in_seen=int(np.floor(1 / rate)) if rate > 0 else None,
        rates=[FleetRate(one_in=k, probability=fleet_stats.seen_probability(n, 1 / k)) for k in SHOWN_RATES],
        plan_one_in=plan_one_in,
        plan_repeats=fleet_stats.repeats_for(1 / plan_one_in, steps, POWER) if plan_one_in else None,
    )


def _final(run: fleet_stats.FleetRun, metric: str) -> float | None:
    if metric not in run.series or len(run.series[metric][1]) == 0:
        return None
    return float(np.asarray(run.series[metric][1])[-1])


def _across(runs: Sequence[fleet_stats.FleetRun], result: fleet_stats.FleetResult, metric: str | None,
            margins: Mapping[str, float | None]) -> list[FleetAcross]:
    if metric is None or len(result.groups) < 2:
        return []
    import scipy.stats  # here, not at import: the web app imports scipy only where a statistic is computed

    from steady.server.stats.portability import tost

    reference = max(result.groups, key=lambda g: (g.runs, g.group))
    named = {f.worker for g in result.groups for f in g.findings}

    def finals(group: str) -> np.ndarray:  # a named worker's runs do not speak for their stack
        values = [_final(r, metric) for r in runs if r.group == group and r.worker not in named]
        return np.array([v for v in values if v is not None and np.isfinite(v)])

    ref = finals(reference.group)
    margin = margins.get(metric)
    out = []
    for g in result.groups:
        if g.group == reference.group:
            continue
        cand = finals(g.group)
        if margin is None or ref.size < 2 or cand.size < 2:
            out.append(FleetAcross(reference_group=reference.group, candidate_group=g.group, metric=metric,
                                   margin=margin, verdict="not_asked" if margin is None else "inconclusive"))
            continue
        t = tost(ref, cand, margin=margin)
        half = float(scipy.stats.t.ppf(1 - TOST_ALPHA, t.df)) * t.se if t.se > 0 else 0.0
        verdict: Literal["equivalent", "not_equivalent", "inconclusive"] = "inconclusive"
        if t.p_value < TOST_ALPHA and not t.withheld:
            verdict = "equivalent"
        elif t.diff - half > margin or t.diff + half < -margin:  # the (1 − 2α) interval lies outside the margin
            verdict = "not_equivalent"
        out.append(FleetAcross(reference_group=reference.group, candidate_group=g.group, metric=metric,
                               margin=margin, verdict=verdict, diff=t.diff, p_value=t.p_value))
    return out
