"""One failure policy: every verdict value and every expectation, driven through every view of a
study's judgment (`steady report`'s exit code and text, `submit --wait`'s summary line, `steady check`'s
checks, exit code and reason, the dashboard's outcome badge, the stored summary the metrics export
reads), gives the same outcome with the same reason. In process, on reports the stats core built."""

from __future__ import annotations

import itertools
from typing import get_args

import numpy as np
import pytest

from steady.server.alerts.prometheus import SnapshotCollector
from steady.server.cli import gate
from steady.server.cli.render import render_report
from steady.server.cli.studies import _verdict_summary
from steady.server.cli.support import verdict_exit_code
from steady.server.dashboard.service import badges, outcome_badge
from steady.server.reports.models import Report
from steady.server.reports.outcome import judge
from steady.server.reports.summary import ReportSummary
from steady.server.stats.report import MetricSpec, build_report
from steady.server.stats.vocabulary import PortabilityValue, RepeatabilityValue, SeedStabilityValue
from tests.reports.test_gate import _runs

# the policy, written out: what each value means for the study
STATUS = {"stable": "pass", "equivalent": "pass", "unstable": "fail", "seed_has_no_effect": "fail",
          "not_equivalent": "fail", "inconclusive": "inconclusive"}
MET = {True: "pass", False: "fail", None: "inconclusive"}


@pytest.fixture(scope="module")
def passing() -> dict:
    """Two stacks, strict, 6 seeds × 2 bitwise repeats, within max_std and the margin: every check passes."""
    built = build_report([*_runs(stack="a"), *_runs(stack="b", first_id=100)],
                         [MetricSpec(name="loss", max_std=1.0, margin=0.05)], rng=np.random.default_rng(0))
    report = Report.assemble(built, study={"id": 7, "name": "unit", "status": "completed"})
    assert report.outcome.status == "pass", report.outcome
    return report.model_dump(mode="json", exclude={"outcome"})


def _variant(body: dict, level: str, value: str, met: bool | None = None) -> Report:
    """``body`` with the first verdict of ``level`` set to ``value`` (and, for repeatability, its
    expectation met / missed / inconclusive), judged by the server and read back as the CLI reads it."""
    body = {**body, "verdicts": [dict(v) for v in body["verdicts"]], "headline": [dict(h) for h in body["headline"]]}
    i = next(k for k, v in enumerate(body["verdicts"]) if v["level"] == level)
    body["verdicts"][i].update(verdict=value, summary=f"plain line for {value}")
    if level == "repeatability":
        body["verdicts"][i]["met_expectation"] = met
        body["headline"][0].update(met=met, phrase=f"expectation {met}")
    served = Report.model_validate(body).model_dump_json()
    return Report.model_validate_json(served)


CASES = ([("seed_stability", v, None) for v in get_args(SeedStabilityValue)]
         + [("stack_portability", v, None) for v in get_args(PortabilityValue)]
         + [("repeatability", v, m) for v, m in itertools.product(get_args(RepeatabilityValue), (True, False, None))])


@pytest.mark.parametrize("level,value,met", CASES)
def test_every_view_gives_the_same_outcome_and_reason(passing, level, value, met, capsys):
    report = _variant(passing, level, value, met)
    status = MET[met] if level == "repeatability" else STATUS[value]
    out = report.outcome
    assert out.status == status
    reason = out.reason
    if status != "pass":  # the changed check's plain line (or its level's expectation) is the reason
        assert f"plain line for {value}" in reason or f"expectation {met}" in reason, reason
    # steady report and submit --wait exit as check does: 0 pass, 1 fail, 2 inconclusive (errors: 3)
    assert verdict_exit_code(report) == {"pass": 0, "fail": 1, "inconclusive": 2}[status]
    assert f"outcome: {status.upper() if status != 'pass' else 'PASSED'}: {reason}".replace(
        "outcome: FAIL:", "outcome: FAILED:") in render_report(report)
    # steady submit --wait: the same code, the same reason on stderr
    capsys.readouterr()
    assert _verdict_summary(report, 7) == verdict_exit_code(report)
    assert reason in capsys.readouterr().err
    # steady check: 0 / 1 / 2 from the same checks, the same reason
    items = gate.gate_items(report)
    assert gate.exit_code(items) == {"pass": 0, "fail": 1, "inconclusive": 2}[status]
    assert gate.outcome_reason(items, report) == reason
    # the dashboard: the outcome badge, and the level's own badge never green on a failure
    badge = outcome_badge(report)
    assert (badge.tone, badge.hint) == ({"pass": "good", "fail": "bad", "inconclusive": "unknown"}[status], reason)
    assert badges(report)[0] == badge
    if status == "fail":
        assert next(b for b in badges(report) if b.level == level).tone == "bad"
    # the summary kept with an alert evaluation, and the metrics export that reads it
    summary = ReportSummary.read(ReportSummary.of(report).model_dump(mode="json"))
    assert (summary.outcome, summary.outcome_reason) == (status, reason)
    families = {m.name: m for m in SnapshotCollector({
        "evaluations": [({"id": 7, "name": "unit", "suite": None}, summary)], "study_runs": [], "run_totals": {},
        "workers": (0, 0), "quarantined": 0, "firing": [], "outbox": {}}).collect()}
    (sample,) = families["steady_study_outcome"].samples
    assert sample.value == {"pass": 0, "fail": 1, "inconclusive": 2}[status]


# --- the outcome of what was asked ------------------------------------------------------------------------------


def _once(stack: str, values: list[float], first_id: int = 0) -> list:
    """seeded runs of one stack (or arm), each seed run once, ending on ``values``."""
    from steady.server.stats.report_data import RunData

    steps = np.arange(5)
    return [RunData(run_id=first_id + s, seed=s, repeat=0, determinism="seeded", stack=stack,
                    digests={"initial_weights": f"w{s}", "data_order": [f"d{s}"]},
                    series={"loss": (steps, np.linspace(2.0, v, steps.size))}) for s, v in enumerate(values)]


def _every_view(report: Report, status: str, capsys) -> None:
    """``status`` with the report's reason in every view that exits by it."""
    code = {"pass": 0, "fail": 1, "inconclusive": 2}[status]
    assert report.outcome.status == status, report.outcome
    assert verdict_exit_code(report) == code
    capsys.readouterr()
    assert _verdict_summary(report, report.study.id) == code
    assert report.outcome.reason in capsys.readouterr().err
    items = gate.gate_items(report)
    assert gate.exit_code(items) == code and gate.outcome_reason(items, report) == report.outcome.reason
    assert outcome_badge(report).tone == {"pass": "good", "fail": "bad", "inconclusive": "unknown"}[status]


@pytest.mark.parametrize("resumed,status", [("identical", "pass"), ("not_restored", "fail"), ("failed", "inconclusive")])
def test_a_study_that_asks_only_for_a_resume_check_exits_by_that_check(resumed, status, capsys):
    """Five seeds run once, no max_std, a resume check: seed stability has no limit to judge against and no seed
    has repeats, so the resume check alone decides (it used to end inconclusive, exit 2, whatever the resume)."""
    from steady.server.reports.parts import ResumeCheck

    built = build_report(_once("default", [0.50, 0.52, 0.49, 0.51, 0.53]), [MetricSpec(name="loss")],
                         rng=np.random.default_rng(0))
    report = Report.assemble(built, study={"id": 8, "name": "resume", "status": "completed", "repeats": 1})
    report.resume = [ResumeCheck(run_id=0, seed=0, stack="default", determinism="seeded", at=[3], verdict=resumed,
                                 missing=["optimizer_state"] if resumed == "not_restored" else [],
                                 summary=f"resume {resumed}", reason=f"resume {resumed}", guarantee="")]
    report.outcome = judge(report)
    _every_view(report, status, capsys)
    assert report.outcome.reason.endswith(f"resume {resumed}") or status == "pass"
    by_kind = {c.kind: c for c in report.outcome.checks}
    seeds = by_kind["seed_stability"]  # shown, with why it does not decide, and what it measured
    assert seeds.status == "not_asked" and seeds.summary == "not asked: nothing to judge against: the spec gives " \
        "loss no max_std", seeds
    assert "std" in seeds.reason
    assert all(c.status == "not_asked" for c in report.outcome.checks if c.kind in ("expectation", "repeatability"))
    if status == "pass":
        assert report.outcome.reason.startswith("the one check asked passed (") and "not asked)" in report.outcome.reason


def test_a_limit_the_spec_gives_still_decides():
    """With a max_std, seed stability is asked: the same five seeds run once are judged (5 seeds: a verdict)."""
    built = build_report(_once("default", [0.50, 0.52, 0.49, 0.51, 0.53]), [MetricSpec(name="loss", max_std=1.0)],
                         rng=np.random.default_rng(0))
    report = Report.assemble(built, study={"id": 8, "name": "seeds", "status": "completed", "repeats": 1})
    (seeds,) = [c for c in report.outcome.checks if c.kind == "seed_stability"]
    assert seeds.status != "not_asked"
    assert report.outcome.status == seeds.status


def test_nothing_asked_is_inconclusive_and_says_what_was_missing(capsys):
    built = build_report(_once("default", [0.50, 0.52, 0.49, 0.51, 0.53]), [MetricSpec(name="loss")],
                         rng=np.random.default_rng(0))
    report = Report.assemble(built, study={"id": 8, "name": "nothing", "status": "completed", "repeats": 1})
    _every_view(report, "inconclusive", capsys)
    assert report.outcome.reason.startswith("nothing asked that this study can judge: "), report.outcome.reason
    assert "no max_std" in report.outcome.reason or "repeats: 1" in report.outcome.reason


def _sources_table(verdicts: dict[str, str]) -> list:
    from steady.server.reports.sources import SdRatioOut, SourceRowOut, SourcesTableOut

    rows = [SourceRowOut(source=s, label=s, status="measured", n=12, sd=0.05, sd_lower=0.04, sd_upper=0.07,
                         vs_all=SdRatioOut(ratio=ratio, lower=ratio * 0.8, upper=ratio * 1.25, p_value=0.01,
                                           verdict=v), runs_needed=40 if v == "inconclusive" else None)
            for s, v, ratio in ((s, v, {"equivalent": 1.0, "not_equivalent": 0.1, "inconclusive": 1.3}[v])
                                for s, v in verdicts.items())]
    rows.append(SourceRowOut(source="dropout", label="dropout masks", status="not_varied",
                             note="the code never reads the dropout seed"))
    return [SourcesTableOut(metric="loss", margin=1.5, alpha=0.05, rows=rows,
                            all_sources=SourceRowOut(source="all", label="all sources", status="measured", n=12,
                                                     sd=0.05, sd_lower=0.04, sd_upper=0.07))]


@pytest.mark.parametrize("answers,status", [({"init": "equivalent", "data": "not_equivalent"}, "pass"),
                                            ({"init": "equivalent", "data": "inconclusive"}, "inconclusive")])
def test_a_sources_study_is_judged_on_its_sources_not_on_its_arms_means(answers, status, capsys):
    """The defect: a sources study failed on 'loss seeded/all vs none: different: means differ by -0.0966; give a
    margin', a comparison of its arms' means it never asked for. Its question is where the variance comes from:
    each source's TOST against all sources decides (either answer passes; undecided is inconclusive), the arms'
    means are shown as information."""
    rng = np.random.default_rng(5)
    arms = {"none": 0.40 + rng.normal(0, 0.001, 12), "init": 0.50 + rng.normal(0, 0.05, 12),
            "data": 0.50 + rng.normal(0, 0.005, 12), "all": 0.50 + rng.normal(0, 0.05, 12)}
    runs = [r for i, (arm, v) in enumerate(arms.items()) for r in _once(arm, list(v), first_id=100 * i)]
    built = build_report(runs, [MetricSpec(name="loss")], reference_stack="none", rng=np.random.default_rng(0))
    report = Report.assemble(built, study={"id": 9, "name": "sources", "status": "completed", "repeats": 1})
    means = [c for c in report.outcome.checks if c.kind == "stack_portability"]
    assert means and any(c.status == "fail" and "means differ" in c.summary for c in means), means  # as it was
    report.sources = _sources_table(answers)
    report.outcome = judge(report)
    _every_view(report, status, capsys)
    assert all(c.status == "not_asked" and "not the means of its arms" in c.summary for c in means
               for c in [next(x for x in report.outcome.checks if x.name == c.name)])
    sources = {c.name: c for c in report.outcome.checks if c.kind == "sources"}
    assert sources["loss dropout vs all sources"].status == "not_asked"
    assert sources["loss init vs all sources"].summary.startswith("about the full variance: SD ratio 1 (90% CI 0.8–1.25)")
    if status == "inconclusive":
        assert report.outcome.reason.startswith("loss data vs all sources: cannot tell yet: ") and \
            "about 40 runs per arm would decide" in report.outcome.reason


def test_a_failed_study_fails_for_the_reason_it_ended_on(capsys):
    """The defect: a study whose every run failed (or logged no metric) read 'INCONCLUSIVE: nothing to judge', exit 2,
    in `steady report`, while `submit --wait` exited 1. Every view now says it failed, and why."""
    why = "no run logged any of the study's metrics: the spec names metric 'loss' but no run logged it"
    built = build_report([], [MetricSpec(name="loss")], rng=np.random.default_rng(0))
    report = Report.assemble(built, study={"id": 10, "name": "wlm", "status": "failed", "status_reason": why})
    _every_view(report, "fail", capsys)
    assert report.outcome.reason == f"study: {why}"
    assert f"outcome: FAILED: study: {why}" in render_report(report)
