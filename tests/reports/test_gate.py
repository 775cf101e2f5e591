"""The gate of `steady check` on reports built by the stats core (no server): exit codes, JUnit XML, Markdown."""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET

import junitparser
import numpy as np
import pytest
from pydantic import ValidationError

from steady.server.alerts.schemas import BaselineComparisonOut
from steady.server.cli import gate
from steady.server.reports.models import Report, typed_verdicts
from steady.server.reports.parts import PairGroup
from steady.server.stats.report import MetricSpec, RunData, build_report

STEPS = np.arange(0, 60, 3, dtype=np.int64)


def _runs(*, repeat_noise: float = 0.0, seeds: int = 6, stack: str = "cpu", first_id: int = 0) -> list[RunData]:
    """strict runs, ``seeds`` seeds × 2 repeats; repeats differ by ``repeat_noise`` (kernel-like, same digests)."""
    rng = np.random.default_rng(3)
    runs = []
    for s in range(seeds):
        base = 1.0 / (1 + STEPS / 20) + rng.normal(0, 0.01)
        for rep in range(2):
            v = base + (rng.normal(0, repeat_noise, STEPS.size) if rep and repeat_noise else 0.0)
            runs.append(RunData(run_id=first_id + len(runs), seed=s, repeat=rep, determinism="strict", stack=stack,
                                digests={"initial_weights": f"w{s}", "data_order": [f"d{s}"]},
                                series={"loss": (STEPS, np.asarray(v, dtype=np.float64))}))
    return runs


def _report(*, repeat_noise: float = 0.0, max_std: float | None = 1.0, seeds: int = 6) -> Report:
    report = build_report(_runs(repeat_noise=repeat_noise, seeds=seeds), [MetricSpec(name="loss", max_std=max_std)],
                          rng=np.random.default_rng(0))
    return Report.assemble(report, study={"id": 7, "name": "unit", "status": "completed"})


def _comparison(verdict: str) -> BaselineComparisonOut:
    """A real stack-portability verdict (baseline against candidate), its value set to ``verdict``."""
    cross = build_report([*_runs(stack="baseline"), *_runs(stack="candidate:cpu", first_id=100)],
                         [MetricSpec(name="loss", margin=0.05)], reference_stack="baseline",
                         rng=np.random.default_rng(0))
    (v,) = [v for v in typed_verdicts(cross) if v.level == "stack_portability"]
    v = v.model_copy(update={"verdict": verdict, "reason": f"{verdict} because",
                             "group": PairGroup(determinism="strict", reference="baseline", reference_stack=None,
                                                candidate_stack="cpu")})
    return BaselineComparisonOut(suite="nightly", study_id=7, baseline_study_id=1, baseline_version=3,
                                 baseline_digest=DIGEST, alpha=0.05, verdicts=[v])


DIGEST = hashlib.sha256(b"a frozen baseline").hexdigest()


def test_a_baseline_check_names_the_snapshot_by_version_and_short_digest(tmp_path):
    items = gate.gate_items(_report(), _comparison("not_equivalent"))
    (item,) = [i for i in items if i.kind == "baseline"]
    assert item.name == f"loss strict/cpu vs reference vs baseline of nightly v3 sha256:{DIGEST[:12]}"
    assert DIGEST not in item.name  # short enough for a console column
    md = gate.markdown(items, title="t")
    assert f"sha256:{DIGEST[:12]}" in md
    path = tmp_path / "g.xml"
    path.write_bytes(gate.junit_xml(items, suite_name="s"))
    assert [c.name for c in list(junitparser.JUnitXml.fromfile(str(path)))[0]
            if c.classname == "steady.baseline"] == [item.name]
    legacy = _comparison("equivalent").model_copy(update={"baseline_version": None, "baseline_digest": None})
    (old,) = [i for i in gate.gate_items(_report(), legacy) if i.kind == "baseline"]
    assert old.name.endswith("vs baseline of nightly (live runs of study 1: set before snapshots)")


def test_every_check_passed_exits_0():
    items = gate.gate_items(_report())
    assert {i.kind for i in items} == {"expectation", "repeatability", "seed_stability"}
    assert all(i.status == gate.PASS for i in items), items
    assert all(i.guarantee for i in items)  # every decision states its false-alarm level
    assert gate.exit_code(items) == 0
    assert gate.exit_code(gate.gate_items(_report(), _comparison("equivalent"))) == 0


def test_a_failed_expectation_or_comparison_exits_1_and_wins_over_inconclusive():
    items = gate.gate_items(_report(repeat_noise=1e-3))
    failed = {i.kind for i in items if i.status == gate.FAIL}
    assert failed == {"expectation", "repeatability"}, items
    assert gate.exit_code(items) == 1
    # failing repeatability and a band with no max_std to judge against (not asked, shown): failure wins
    items = gate.gate_items(_report(repeat_noise=1e-3, max_std=None))
    assert {i.status for i in items} >= {gate.FAIL, gate.NOT_ASKED} and gate.exit_code(items) == 1
    # a failing comparison with the baseline fails a study whose own verdicts pass
    items = gate.gate_items(_report(), _comparison("not_equivalent"))
    assert [i.kind for i in items if i.status == gate.FAIL] == ["baseline"] and gate.exit_code(items) == 1


def test_inconclusive_exits_2():
    items = gate.gate_items(_report(max_std=None))  # no limit on the seed spread: a band, no claim
    (band,) = [i for i in items if i.kind == "seed_stability"]
    assert band.status == gate.NOT_ASKED and "no max_std" in band.reason
    assert gate.exit_code(items) == 0  # shown, not the exit code: the repeats the spec asked for decide
    assert gate.exit_code(gate.gate_items(_report(), _comparison("inconclusive"))) == 2
    # an empty report is never a pass; an unknown verdict does not even read as a report
    empty = build_report([], [MetricSpec(name="loss")], rng=np.random.default_rng(0))
    assert gate.exit_code(gate.gate_items(Report.assemble(empty, study={"id": 7, "name": "u", "status": "open"}))) == 2
    odd = _report().model_dump(mode="json")
    odd["verdicts"][0]["verdict"] = "novel"
    with pytest.raises(ValidationError, match="verdict"):
        Report.model_validate(odd)


@pytest.mark.parametrize("noise,max_std", [(0.0, 1.0), (1e-3, None)])
def test_junit_xml_has_the_shape_ci_servers_read(tmp_path, noise, max_std):
    items = gate.gate_items(_report(repeat_noise=noise, max_std=max_std), _comparison("equivalent"))
    raw = gate.junit_xml(items, suite_name="steady study 7 (<unit> & \x1b[31m)", link="http://h/studies/7",
                         timestamp="2026-01-01T00:00:00")
    root = ET.fromstring(raw)
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == len(items) == int(suite.get("tests")) == int(root.get("tests"))
    assert int(suite.get("failures")) == sum(i.status == gate.FAIL for i in items) == len(suite.findall("*/failure"))
    assert int(suite.get("skipped")) == sum(i.status in (gate.INCONCLUSIVE, gate.NOT_ASKED) for i in items)
    assert suite.get("errors") == "0" and "\x1b" not in suite.get("name")
    for case, item in zip(cases, items, strict=True):
        assert case.get("name") and case.get("classname", "").startswith("steady.")
        children = [c.tag for c in case]
        assert children[-1] == "system-out" and set(children) <= {"failure", "skipped", "system-out"}
        if item.status == gate.FAIL:
            assert case.find("failure").get("message") == item.reason and case.find("failure").get("type")
        if item.status == gate.INCONCLUSIVE:
            assert case.find("skipped").get("message").startswith("inconclusive: ")
        if item.status == gate.NOT_ASKED:
            assert case.find("skipped").get("message").startswith("not asked: ")
        assert "http://h/studies/7" in case.find("system-out").text
    # read back as CI tools read it
    path = tmp_path / "out.xml"
    path.write_bytes(raw)
    xml = junitparser.JUnitXml.fromfile(str(path))
    (ts,) = list(xml)
    assert ts.tests == len(items) and ts.failures == int(suite.get("failures"))
    results = {(c.classname, c.name): [type(r).__name__ for r in c.result] for c in ts}
    assert len(results) == len(items)  # (classname, name) names each check once
    for item in items:
        expected = {gate.PASS: [], gate.FAIL: ["Failure"], gate.INCONCLUSIVE: ["Skipped"],
                    gate.NOT_ASKED: ["Skipped"]}[item.status]
        assert results[(f"steady.{item.kind}", item.name)] == expected, item


def test_markdown_has_one_line_per_check_with_reason_guarantee_and_link():
    items = gate.gate_items(_report(repeat_noise=1e-3), _comparison("equivalent"))
    text = gate.markdown(items, title="study 7 (unit | x)", link="http://h/studies/7")
    head, *rest = text.splitlines()
    assert head == "### Steady gate: study 7 (unit \\| x): FAILED (exit 1)"
    lines = [line for line in rest if line.startswith("- ")]
    assert len(lines) == len(items)
    for line, item in zip(lines, items, strict=True):
        assert item.name.split()[0] in line and "[dashboard](http://h/studies/7)" in line
        assert ("**fail**" in line) == (item.status == gate.FAIL)
        assert "_Guarantee: " in line


RCP = {"mean": 215040, "std": 11976.9, "n": 18}  # a published MLPerf reference point (steady.server.stats.convergence)


def _with_convergence(hits: list[float]) -> Report:
    """The passing unit report plus a convergence section judged by the stats core against ``RCP``,
    shaped as ``steady.server.reports.service.convergence_section`` shapes it."""
    from steady.server.stats.convergence import ReferencePoint, check_convergence
    from steady.server.stats.report import to_data

    result = check_convergence(hits, ReferencePoint(**RCP))
    section = {"metric": "loss", "target": 0.1, "direction": "min", "group": {"determinism": "seeded", "stack": "cpu"},
               "reference": {"source": "numbers", **RCP}, **to_data(result)}
    return Report.model_validate({**_report().model_dump(mode="json", exclude={"outcome"}), "convergence": [section]})


def test_a_candidate_converging_significantly_faster_than_the_reference_fails_the_gate(tmp_path):
    from steady.server.cli.support import failing_verdicts, verdict_exit_code

    fast = _with_convergence([190000.0 + 1000 * s for s in range(10)])  # olympic mean 194500 < floor 206333
    items = gate.gate_items(fast)
    (conv,) = [i for i in items if i.kind == "convergence"]
    assert conv.name == "steps to loss<=0.1 seeded/cpu" and conv.status == gate.FAIL
    for needle in ("candidate mean 194500 steps", "minimum acceptable mean 206333", "max speed-up ×1.0422",
                   "normalisation factor ×1.1056"):
        assert needle in conv.reason, conv.reason
    assert "0.05" in conv.guarantee
    assert gate.exit_code(items) == 1  # every other check of the unit report passes
    assert failing_verdicts(fast) == [(conv.name, fast.outcome.checks[-1].summary)] and verdict_exit_code(fast) == 1
    path = tmp_path / "gate.xml"
    path.write_bytes(gate.junit_xml(items, suite_name="steady study 7"))
    (ts,) = list(junitparser.JUnitXml.fromfile(str(path)))
    (case,) = [c for c in ts if c.classname == "steady.convergence"]
    assert [type(r).__name__ for r in case.result] == ["Failure"] and "206333" in case.result[0].message
    assert "steps to loss&lt;=0.1 seeded/cpu" in gate.markdown(items, title="study 7")  # no HTML in Markdown

    # converging at the reference's pace passes; too few runs to trim is inconclusive, never a pass
    like = _with_convergence([215040.0 + 3000 * (s - 4.5) for s in range(10)])
    assert [i.status for i in gate.gate_items(like) if i.kind == "convergence"] == [gate.PASS]
    assert gate.exit_code(gate.gate_items(like)) == 0 and verdict_exit_code(like) == 0
    few = _with_convergence([200000.0, 201000.0, 202000.0])
    (item,) = [i for i in gate.gate_items(few) if i.kind == "convergence"]
    assert item.status == gate.INCONCLUSIVE and "candidate mean n/a" in item.reason
    assert gate.exit_code(gate.gate_items(few)) == 2
