"""Plain first lines: what a verdict means and what to do, before its statistics, and one number
per claim: a band_width alert quotes the lower bound the report decided with, for the same seeds."""

from __future__ import annotations

import numpy as np

from steady.server.alerts import evaluators
from steady.server.alerts.findings import BAD
from steady.server.models import AlertRule
from steady.server.reports.models import Report
from steady.server.stats.alert_rules import band_check, band_check_values
from steady.server.stats.expectations import BUILTIN, SeedRoute
from steady.server.stats.report import MetricSpec, RunData, build_report
from steady.server.studies.alert_specs import rule_adapter

STEPS = np.arange(5, dtype=np.int64)
# 5 seeds whose final values have std 0.048, 2.4× a limit of 0.02, with one far seed (heavy tail):
# the robust bounds straddle the limit, so the claim is not yet made
FINALS = np.array([0.0, 0.01, 0.0, -0.01, 1.0])
FINALS = 1.0 + FINALS / FINALS.std(ddof=1) * 0.048


def _report(finals, *, route: SeedRoute = BUILTIN) -> Report:
    runs = [RunData(run_id=i + 1, seed=i, repeat=0, determinism="seeded", stack="cpu",
                    series={"loss": (STEPS, np.linspace(2.0, f, STEPS.size))}) for i, f in enumerate(finals)]
    built = build_report(runs, [MetricSpec("loss", max_std=0.02)], rng=np.random.default_rng(0), route=route)
    return Report.assemble(built, study={"id": 1, "name": "plain", "status": "completed"})


def _band_alert(report: Report):
    rule = AlertRule(kind="band_width", metric="loss", params={"max": 0.02}, name=None, severity="warning")
    spec = rule_adapter.validate_python({"kind": "band_width", "metric": "loss", "max": 0.02})
    (finding,) = evaluators._eval_band_width(None, None, rule, spec, report, None)
    return finding


def test_std_above_the_limit_with_too_few_seeds_reads_plainly():
    (v,) = _report(FINALS).of_level("seed_stability")
    assert v.verdict == "inconclusive"
    assert v.summary == "likely unstable: std 0.048 is 2.4× the limit 0.02; run ~56 more seeds to confirm"
    assert "~61 seeds" in v.reason and "straddle" in v.reason  # the statistics stay below it


def test_too_few_seeds_far_from_the_limit_say_the_minimum_not_the_plan():
    # 4 seeds, std 4% of the limit: the bound already clears it; only the 5-seed minimum holds the verdict back
    (v,) = _report(1.0 + np.array([0.0, 0.001, -0.001, 0.0005])).of_level("seed_stability")
    assert v.verdict == "inconclusive" and "only 4 seeds (minimum 5)" in v.reason
    assert v.summary.startswith("likely stable: std 0.000854 is 0.043× the limit 0.02")
    assert v.summary.endswith("; run at least 1 more seed (a verdict needs 5)"), v.summary
    # near the limit the plan's seeds remain the advice
    (near,) = _report(1.0 + np.array([0.0, 0.02, -0.02, 0.01])).of_level("seed_stability")
    assert near.verdict == "inconclusive" and near.summary.endswith("more seeds to confirm"), near.summary


def test_the_alert_quotes_the_reports_lower_bound():
    report = _report(FINALS)
    (v,) = report.of_level("seed_stability")
    lower = v.spread.decision_bounds.lower  # what the report compared with max_std
    finding = _band_alert(report)
    assert finding.details["lower_bound"] == lower == band_check_values(FINALS, limit=0.02).lower
    assert f"{lower:.4g}" in finding.summary
    # the chi-square bound alone is another number for the same std: the one the alert used to quote
    assert band_check(float(FINALS.std(ddof=1)), 5, limit=0.02).lower > 1.5 * lower


def test_seeds_without_effect_fire_the_band_alert_with_the_reports_line():
    report = _report([1.0] * 5, route=SeedRoute("command", receives_seed=True))
    (v,) = report.of_level("seed_stability")
    assert v.verdict == "seed_has_no_effect" and v.n_needed is None
    finding = _band_alert(report)
    assert finding.firing is BAD and v.summary in finding.summary
