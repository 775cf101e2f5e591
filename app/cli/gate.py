"""Steady as a CI gate: a study report (and its comparisons with a suite baseline) as pass/fail/inconclusive
checks, the exit code they give, and their JUnit XML and Markdown forms (``steady check``).

``gate_items`` is the one place that reads the report (``steady.server.reports.models.Report``, as served by
``GET /api/v1/studies/{id}/report``) and the comparison of ``GET /api/v1/suites/{suite}/baseline/compare``;
everything else reads ``GateItem``s. Client-side: no FastAPI, no SQLAlchemy.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass

from steady.server.reports.models import (
    BaselineComparisonOut,
    Convergence,
    RepeatabilityVerdict,
    Report,
    SeedStabilityVerdict,
    Verdict,
)
from steady.server.reports.parts import PairGroup, StackGroup
from steady.server.stats.vocabulary import severity
from steady.server.kit.terminal import printable

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
EXIT_CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 2}  # failure wins over inconclusive (see exit_code)

_EXPECTATION_STATUS = {True: PASS, False: FAIL, None: INCONCLUSIVE}


@dataclass(frozen=True)
class GateItem:
    """One check of the gate: a level's expectation, a verdict, a cost budget or a baseline comparison."""

    kind: str  # expectation | repeatability | seed_stability | stack_portability | determinism_cost | convergence
    #            | baseline
    name: str
    status: str  # pass | fail | inconclusive
    reason: str
    guarantee: str  # the decision's stated false-alarm level, in words ("" when it has none)


def _group(group: StackGroup | PairGroup) -> str:
    if isinstance(group, PairGroup):
        return f"{group.determinism}/{group.candidate_stack} vs {group.reference_stack or 'reference'}"
    return "/".join(p for p in (group.determinism, group.stack) if p)


def _guarantee(v: Verdict) -> str:
    parts = [v.guarantee] if v.guarantee else []
    if isinstance(v, SeedStabilityVerdict) and v.out_of_band_test is not None and v.out_of_band_test.guarantee:
        parts.append(f"out-of-band runs: {v.out_of_band_test.guarantee}")
    return "; ".join(parts)


def _verdict_status(verdict: str | None) -> str:
    """Good and within-tolerance values pass, bad ones fail; anything else is inconclusive, never a pass."""
    return {0: PASS, 1: PASS, 3: FAIL}.get(severity(verdict), INCONCLUSIVE)


def _number(x: float | None, fmt: str = ".6g") -> str:
    return "n/a" if x is None else format(x, fmt)


def _convergence_item(c: Convergence) -> GateItem:
    """A convergence check (MLPerf RCP rule): the numbers a reviewer needs to see why it passed or
    failed, whatever the reason's wording: candidate mean, floor, allowed speed-up, normalisation."""
    name = f"steps to {c.metric}{'<=' if c.direction == 'min' else '>='}{c.target:g} {_group(c.group)}"
    numbers = (f"candidate mean {_number(c.candidate_mean)} steps; minimum acceptable mean "
               f"{_number(c.min_acceptable_mean)}; max speed-up ×{_number(c.max_speedup, '.4f')}; "
               f"normalisation factor ×{_number(c.normalization_factor, '.4f')}")
    return GateItem("convergence", name, _verdict_status(c.verdict), f"{c.verdict}: {c.reason} ({numbers})",
                    c.guarantee)


def baseline_name(c: BaselineComparisonOut) -> str:
    """The baseline as the gate names it: suite, version and the first 12 hex digits of the snapshot's
    SHA-256, so a reader of the console, the JUnit file or the Markdown can tell which frozen content a
    check compared with (and two jobs whether they compared with the same one)."""
    if c.baseline_version is None or not c.baseline_digest:
        return f"baseline of {c.suite} (live runs of study {c.baseline_study_id}: set before snapshots)"
    return f"baseline of {c.suite} v{c.baseline_version} sha256:{c.baseline_digest[:12]}"


def gate_items(report: Report, comparison: BaselineComparisonOut | None = None) -> list[GateItem]:
    """The report as gate checks, in report order: one per level expectation (headline), per verdict,
    per cost-of-determinism budget, per convergence group and per comparison with the suite baseline.

    A repeatability verdict passes when its level met its expectation (runs at ``none`` are expected
    to differ), other verdicts by their value; anything not understood is inconclusive, never a pass.
    A report with nothing to judge gives one inconclusive item: an empty gate does not pass.
    """
    items: list[GateItem] = []
    for h in report.headline:
        promise = next((v.guarantee for v in report.of_level("repeatability")
                        if v.group.determinism == h.determinism and v.guarantee), "")
        reason = h.phrase
        if h.suspicious:
            reason += "; suspicious: " + "; ".join(h.suspicious)
        items.append(GateItem("expectation", f"{h.determinism}: {h.expected}",
                              _EXPECTATION_STATUS[h.met], reason, promise))
    for v in report.verdicts:
        if isinstance(v, RepeatabilityVerdict):
            status = _EXPECTATION_STATUS[v.met_expectation]
            reason = f"{v.verdict}: {v.reason} (expected: {v.expectation})"
        else:
            status = _verdict_status(v.verdict)
            reason = f"{v.verdict}: {v.reason}"
        items.append(GateItem(v.level, f"{v.metric} {_group(v.group)}", status, reason, _guarantee(v)))
    for c in report.determinism_cost:
        if c.verdict is None:  # no budget given: a measurement, not a check
            continue
        name = f"step time {c.numerator}/{c.denominator} {c.stack}".rstrip()
        reason = f"{c.verdict}: ratio {c.ratio} (CI {c.ci_low}..{c.ci_high}) against budget ×{c.budget}"
        items.append(GateItem("determinism_cost", name, _verdict_status(c.verdict), c.reason or reason, c.guarantee))
    items += [_convergence_item(c) for c in report.convergence or ()]
    if comparison is not None:
        against = baseline_name(comparison)
        for pv in comparison.verdicts:
            items.append(GateItem("baseline", f"{pv.metric} {_group(pv.group)} vs {against}",
                                  _verdict_status(pv.verdict), f"{pv.verdict}: {pv.reason}", _guarantee(pv)))
        if not comparison.verdicts:
            items.append(GateItem("baseline", f"vs {against}", INCONCLUSIVE,
                                  "no metric and determinism level in common with the baseline", ""))
    if not items:
        items.append(GateItem("report", "study", INCONCLUSIVE, "nothing to judge: no verdict in the report", ""))
    return items


def exit_code(items: Iterable[GateItem]) -> int:
    """0 when every check passed, 1 when one failed, 2 when none failed and one is inconclusive."""
    statuses = {i.status for i in items}
    if FAIL in statuses:
        return EXIT_CODES[FAIL]
    if INCONCLUSIVE in statuses:
        return EXIT_CODES[INCONCLUSIVE]
    return EXIT_CODES[PASS]


def outcome(code: int) -> str:
    return {0: "passed", 1: "FAILED", 2: "inconclusive"}.get(code, f"exit {code}")


# --- JUnit XML ---------------------------------------------------------------------------------


def junit_xml(items: list[GateItem], *, suite_name: str, link: str = "", timestamp: str | None = None) -> bytes:
    """One ``<testsuite>`` in ``<testsuites>``, one ``<testcase>`` per item (``classname`` ``steady.<kind>``):
    a failure is ``<failure message type>``, an inconclusive check ``<skipped message>``; the guarantee and
    the dashboard link go in ``<system-out>``. The shape Jenkins' and GitLab's JUnit readers accept."""
    failures = sum(i.status == FAIL for i in items)
    skipped = sum(i.status == INCONCLUSIVE for i in items)
    counts = {"tests": str(len(items)), "failures": str(failures), "errors": "0", "skipped": str(skipped),
              "time": "0"}
    root = ET.Element("testsuites", {"name": "steady", **counts})
    attrs = {"name": printable(suite_name), **counts}
    if timestamp:
        attrs["timestamp"] = timestamp
    suite = ET.SubElement(root, "testsuite", attrs)
    if link:
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", {"name": "dashboard", "value": printable(link)})
    for i in items:
        case = ET.SubElement(suite, "testcase", {"classname": f"steady.{i.kind}", "name": printable(i.name),
                                                 "time": "0"})
        if i.status == FAIL:
            node = ET.SubElement(case, "failure", {"message": printable(i.reason), "type": "steady." + i.kind})
            node.text = printable(i.reason)
        elif i.status == INCONCLUSIVE:
            ET.SubElement(case, "skipped", {"message": "inconclusive: " + printable(i.reason)})
        out = [f"{i.status}: {i.reason}"]
        if i.guarantee:
            out.append(f"guarantee: {i.guarantee}")
        if link:
            out.append(f"dashboard: {link}")
        ET.SubElement(case, "system-out").text = printable("\n".join(out))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


# --- Markdown ----------------------------------------------------------------------------------

_MARK = {PASS: "✅ pass", FAIL: "❌ **fail**", INCONCLUSIVE: "⚠️ inconclusive"}


def _md(text: str) -> str:
    """User text inside a Markdown line: no control characters, no line breaks, no table/HTML syntax."""
    return (printable(text).replace("\n", " ").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;"))


def markdown(items: list[GateItem], *, title: str, link: str = "") -> str:
    """A summary for a merge request or a chat: the outcome, then one line per check with its reason,
    its guarantee and the dashboard link."""
    code = exit_code(items)
    head = f"### Steady gate: {_md(title)}: {outcome(code)} (exit {code})"
    counts = {s: sum(i.status == s for i in items) for s in (PASS, FAIL, INCONCLUSIVE)}
    lines = [head, "", f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[INCONCLUSIVE]} inconclusive"
             + (f" — [dashboard]({link})" if link else ""), ""]
    for i in items:
        line = f"- {_MARK[i.status]} `{_md(i.kind)}` {_md(i.name)}: {_md(i.reason)}"
        if i.guarantee:
            line += f" _Guarantee: {_md(i.guarantee)}._"
        if link:
            line += f" [dashboard]({link})"
        lines.append(line)
    return "\n".join(lines) + "\n"
