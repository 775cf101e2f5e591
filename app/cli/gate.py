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

from steady.server.reports.models import BaselineComparisonOut, Report
from steady.server.reports.outcome import FAIL, INCONCLUSIVE, NOT_ASKED, PASS, group_label, verdict_status
from steady.server.kit.terminal import printable

EXIT_CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 2}  # failure wins over inconclusive (see exit_code)


@dataclass(frozen=True)
class GateItem:
    """One check of the gate: a check of the report's outcome (``Report.outcome.checks``) or a baseline comparison."""

    kind: str  # study | expectation | repeatability | seed_stability | stack_portability | sources | determinism_cost
    #            | convergence | resume | baseline | report
    name: str
    status: str  # pass | fail | inconclusive | not_asked (information: never the exit code)
    reason: str
    guarantee: str  # the decision's stated false-alarm level, in words ("" when it has none)


def baseline_name(c: BaselineComparisonOut) -> str:
    """The baseline as the gate names it: suite, version and the first 12 hex digits of the snapshot's
    SHA-256, so a reader of the console, the JUnit file or the Markdown can tell which frozen content a
    check compared with (and two jobs whether they compared with the same one)."""
    if c.baseline_version is None or not c.baseline_digest:
        return f"baseline of {c.suite} (live runs of study {c.baseline_study_id}: set before snapshots)"
    return f"baseline of {c.suite} v{c.baseline_version} sha256:{c.baseline_digest[:12]}"


def gate_items(report: Report, comparison: BaselineComparisonOut | None = None) -> list[GateItem]:
    """The checks of the report's outcome, as the server judged them (``steady.server.reports.outcome``:
    one policy for every gate), each with its plain first line before its statistics, then one per
    comparison with the suite baseline. A report with nothing to judge gives one inconclusive item:
    an empty gate does not pass (nor does one whose every check is ``not_asked``)."""
    items = [GateItem(c.kind, c.name, c.status, c.summary if c.reason in c.summary else f"{c.summary} — {c.reason}",
                      c.guarantee) for c in report.outcome.checks]
    if comparison is not None:
        against = baseline_name(comparison)
        for pv in comparison.verdicts:
            guarantee = pv.guarantee or ""
            items.append(GateItem("baseline", f"{pv.metric} {group_label(pv.group)} vs {against}",
                                  verdict_status(pv.verdict), f"{pv.verdict}: {pv.reason}", guarantee))
        if not comparison.verdicts:
            items.append(GateItem("baseline", f"vs {against}", INCONCLUSIVE,
                                  "no metric and determinism level in common with the baseline", ""))
    if all(i.status == NOT_ASKED for i in items):
        items.append(GateItem("report", "study", INCONCLUSIVE, report.outcome.reason, ""))
    return items


def exit_code(items: Iterable[GateItem]) -> int:
    """0 when every check asked passed, 1 when one failed, 2 when none failed and one is inconclusive
    (a ``not_asked`` check is information: it never sets the code)."""
    statuses = {i.status for i in items}
    if FAIL in statuses:
        return EXIT_CODES[FAIL]
    if INCONCLUSIVE in statuses:
        return EXIT_CODES[INCONCLUSIVE]
    return EXIT_CODES[PASS]


def outcome_reason(items: list[GateItem], report: Report | None) -> str:
    """Why the gate gives its exit code: the report's own reason (the one ``steady report`` and
    ``submit --wait`` print) unless a check the report does not hold (the suite baseline, a failed
    study) decided it instead."""
    status = {v: k for k, v in EXIT_CODES.items()}[exit_code(items)]
    if report is not None and report.outcome.status == status:
        return report.outcome.reason
    first = next((i for i in items if i.status == status), None)
    return f"{first.name}: {first.reason}" if first is not None else ""


def outcome(code: int) -> str:
    return {0: "passed", 1: "FAILED", 2: "inconclusive"}.get(code, f"exit {code}")


# --- JUnit XML ---------------------------------------------------------------------------------


def junit_xml(items: list[GateItem], *, suite_name: str, link: str = "", timestamp: str | None = None) -> bytes:
    """One ``<testsuite>`` in ``<testsuites>``, one ``<testcase>`` per item (``classname`` ``steady.<kind>``):
    a failure is ``<failure message type>``, an inconclusive or not-asked check ``<skipped message>``; the guarantee and
    the dashboard link go in ``<system-out>``. The shape Jenkins' and GitLab's JUnit readers accept."""
    failures = sum(i.status == FAIL for i in items)
    skipped = sum(i.status in (INCONCLUSIVE, NOT_ASKED) for i in items)
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
        elif i.status == NOT_ASKED:
            ET.SubElement(case, "skipped", {"message": printable(i.reason)})
        out = [f"{i.status}: {i.reason}"]
        if i.guarantee:
            out.append(f"guarantee: {i.guarantee}")
        if link:
            out.append(f"dashboard: {link}")
        ET.SubElement(case, "system-out").text = printable("\n".join(out))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


# --- Markdown ----------------------------------------------------------------------------------

_MARK = {PASS: "✅ pass", FAIL: "❌ **fail**", INCONCLUSIVE: "⚠️ inconclusive", NOT_ASKED: "➖ not asked"}


def _md(text: str) -> str:
    """User text inside a Markdown line: no control characters, no line breaks, no table/HTML syntax."""
    return (printable(text).replace("\n", " ").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;"))


def markdown(items: list[GateItem], *, title: str, link: str = "") -> str:
    """A summary for a merge request or a chat: the outcome, then one line per check with its reason,
    its guarantee and the dashboard link."""
    code = exit_code(items)
    head = f"### Steady gate: {_md(title)}: {outcome(code)} (exit {code})"
    counts = {s: sum(i.status == s for i in items) for s in (PASS, FAIL, INCONCLUSIVE, NOT_ASKED)}
    lines = [head, "", f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[INCONCLUSIVE]} inconclusive"
             + (f", {counts[NOT_ASKED]} not asked (information)" if counts[NOT_ASKED] else "")
             + (f" — [dashboard]({link})" if link else ""), ""]
    for i in items:
        line = f"- {_MARK[i.status]} `{_md(i.kind)}` {_md(i.name)}: {_md(i.reason)}"
        if i.guarantee:
            line += f" _Guarantee: {_md(i.guarantee)}._"
        if link:
            line += f" [dashboard]({link})"
        lines.append(line)
    return "\n".join(lines) + "\n"
