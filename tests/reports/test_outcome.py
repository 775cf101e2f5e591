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
        "workers": (0, 0), "firing": [], "outbox": {}}).collect()}
    (sample,) = families["steady_study_outcome"].samples
    assert sample.value == {"pass": 0, "fail": 1, "inconclusive": 2}[status]


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


def test_a_failed_study_fails_for_the_reason_it_ended_on(capsys):
    """The defect: a study whose every run failed (or logged no metric) read 'INCONCLUSIVE: nothing to judge', exit 2,
    in `steady report`, while `submit --wait` exited 1. Every view now says it failed, and why."""
    why = "no run logged any of the study's metrics: the spec names metric 'loss' but no run logged it"
    built = build_report([], [MetricSpec(name="loss")], rng=np.random.default_rng(0))
    report = Report.assemble(built, study={"id": 10, "name": "wlm", "status": "failed", "status_reason": why})
    _every_view(report, "fail", capsys)
    assert report.outcome.reason == f"study: {why}"
    assert f"outcome: FAILED: study: {why}" in render_report(report)
