"""What each demo study is there to show, read from its real report, and the closing summary.

A demo study states one purpose ("seeded repeats part through kernels and strict removes it") and the
demo answers it from the report the server built: yes, no, or not shown (with why). A failure the spec
plants on purpose (a limit set below what a metric really varies by) is named here with why it was
planted; the demo calls the study's failure planted only when every failing check is a planted one,
and quotes the cause Steady found for it. The report itself knows nothing of the demo: the planted
limit is an ordinary limit, and the study's description says why it is there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from steady.server.reports.models import Report
from steady.server.reports.outcome import Check, group_label

__all__ = ["Demonstration", "Planted", "PURPOSES", "purpose_line", "outcome_line", "summary_lines", "CHECK_DOCS"]

CHECK_DOCS = {  # where each check is explained (the repository's docs, relative to its root)
    "expectation": "docs/statistics.md#repeatability-expectations",
    "repeatability": "docs/statistics.md#repeatability",
    "seed_stability": "docs/statistics.md#seed-stability",
    "stack_portability": "docs/statistics.md#stack-portability",
    "determinism_cost": "docs/statistics.md#cost-of-determinism",
    "convergence": "docs/statistics.md#convergence-against-a-reference",
    "resume": "docs/resume.md",
}
CHECK_NAMES = {"expectation": "expectations", "repeatability": "repeatability", "seed_stability": "seed stability",
               "stack_portability": "stack portability", "determinism_cost": "cost of determinism",
               "convergence": "convergence", "resume": "resume"}


@dataclass(frozen=True)
class Planted:
    """A failure the spec plants: the ``kind`` of check on ``metric`` is meant to fail, for ``why``."""

    kind: str
    metric: str
    why: str


@dataclass(frozen=True)
class Demonstration:
    """A study's purpose: ``shows`` (a clause after "shows that"), answered by ``holds`` from the report
    (True, False, or None when the report cannot tell, each with the evidence in a few words)."""

    shows: str
    holds: Callable[[Report], tuple[bool | None, str]]
    planted: Planted | None = None


def _repeatability(report: Report, level: str) -> list:
    return [v for v in report.of_level("repeatability") if v.group.determinism == level]


def _identical(report: Report, level: str) -> tuple[bool | None, str]:
    """Every metric's repeats bitwise identical at ``level``."""
    vs = _repeatability(report, level)
    if not vs or any(v.verdict == "inconclusive" for v in vs):
        return None, f"no two repeats of a seed to compare at {level}"
    odd = [v for v in vs if v.verdict != "identical"]
    if odd:
        return False, f"{odd[0].metric} repeats differ at {level} (source: {odd[0].source or 'unknown'})"
    return True, f"{level} repeats bitwise identical"


def _differ(report: Report, level: str, source: str) -> tuple[bool | None, str]:
    """Some metric's repeats differ at ``level``, the first divergence attributed to ``source``."""
    vs = _repeatability(report, level)
    if not vs or all(v.verdict == "inconclusive" for v in vs):
        return None, f"no two repeats of a seed to compare at {level}"
    parted = [v for v in vs if v.verdict in ("within_tolerance", "out_of_tolerance")]
    if not parted:
        return False, f"{level} repeats bitwise identical (nothing parted them in this run)"
    hits = [v for v in parted if v.source == source]
    if not hits:
        return False, f"{level} repeats differ, but from {parted[0].source or 'an unknown source'}, not {source}"
    hit = max(hits, key=lambda v: v.max_abs_delta or 0.0)
    if not hit.max_abs_delta:  # every logged value equal: only a digest parted them
        return True, f"the weights of {level} repeats differ, their logged values not (source: {source})"
    return True, f"{hit.metric} repeats differ at {level} (source: {source})"


def _all(*parts: Callable[[Report], tuple[bool | None, str]]) -> Callable[[Report], tuple[bool | None, str]]:
    def holds(report: Report) -> tuple[bool | None, str]:
        answers = [p(report) for p in parts]
        for wanted in (False, None):
            bad = [why for ok, why in answers if ok is wanted]
            if bad:
                return wanted, "; ".join(bad)
        return True, "; ".join(why for _, why in answers)
    return holds


def _level(check: Callable[..., tuple[bool | None, str]], *args: str) -> Callable[[Report], tuple[bool | None, str]]:
    return lambda report: check(report, *args)


PURPOSES: dict[str, Demonstration] = {
    "torch_mlp.yaml": Demonstration(
        shows="strict and seeded repeat bitwise, none varies from its first step (unseeded weights)",
        holds=_all(_level(_identical, "strict"), _level(_identical, "seeded"), _level(_differ, "none", "seeding")),
        planted=Planted("seed_stability", "val_acc",
                        "val_acc is measured on 359 validation images, so seeds move it by about 5 points; "
                        "its limit is set below that on purpose, to show a failure"),
    ),
    "torch_kernels.yaml": Demonstration(
        shows="seeded repeats part through nondeterministic kernels and strict removes it",
        holds=_all(_level(_differ, "seeded", "numerics"), _level(_identical, "strict")),
    ),
    "keras_mlp.yaml": Demonstration(
        shows="a Keras model repeats bitwise at seeded and at strict (TensorFlow op determinism)",
        holds=_all(_level(_identical, "seeded"), _level(_identical, "strict")),
    ),
}


def _answer(ok: bool | None) -> str:
    return {True: "yes", False: "no", None: "not shown"}[ok]


def purpose_line(demo: Demonstration, report: Report, *, evidence: bool = True) -> str:
    """``shows that <purpose>: yes (<evidence>)`` (``evidence=False``: without the parenthesis)."""
    ok, why = demo.holds(report)
    return f"shows that {demo.shows}: {_answer(ok)}" + (f" ({why})" if evidence else "")


def _planted(demo: Demonstration, report: Report) -> tuple[list[tuple[Check, Any]], list[Check]]:
    """The failing checks of ``report``'s outcome: those the demo planted (each with its verdict), and the others."""
    failing = [c for c in report.outcome.checks if c.status == "fail"]
    p, planted = demo.planted, []
    if p is not None:
        verdicts = {f"{v.metric} {group_label(v.group)}": v for v in report.verdicts if v.level == p.kind}
        planted = [(c, verdicts[c.name]) for c in failing
                   if c.kind == p.kind and c.name in verdicts and verdicts[c.name].metric == p.metric]
    hit = {id(c) for c, _ in planted}
    return planted, [c for c in failing if id(c) not in hit]


def _cause(report: Report, verdict: Any) -> str:
    """What Steady found behind a seed-stability failure: how much of the spread is run-to-run nondeterminism."""
    level = verdict.group.determinism
    v = next((x for x in report.variance_by_source or () if x.metric == verdict.metric and x.group == verdict.group),
             None)
    if v is None or not v.available or v.components is None or v.between_seed_applies is False:
        return ""
    share = v.components.share_within
    if not math.isfinite(share):  # every run gave the same value: nothing to split
        return ""
    if share < 0.005:
        return f"all of the spread is between seeds (repeats of a seed are bitwise identical at {level})"
    return f"{share * 100:.0f}% of the spread is run-to-run nondeterminism at {level}, the rest between seeds"


def outcome_line(demo: Demonstration, report: Report, *, quick: bool = False) -> tuple[str, str, str]:
    """The study's outcome as the summary says it (``PASSED``, ``FAILED, as planted`` …), one line of why, and
    for a planted failure the cause Steady found ("" when none)."""
    out = report.outcome
    planted, other = _planted(demo, report)
    if out.status == "fail" and planted and not other:
        # quote the seeded check where there is one: its runs are deterministic, so its cause is the seed's
        check, verdict = next(((c, v) for c, v in planted if v.group.determinism == "seeded"), planted[0])
        also = sorted({v.group.determinism for _, v in planted} - {verdict.group.determinism})
        cause = _cause(report, verdict)
        why = f"{check.name}: {check.summary.split('; ')[0]}" + (f" (also at {' and '.join(also)})" if also else "")
        return "FAILED, as planted", why, cause
    mark = {"pass": "PASSED", "fail": "FAILED", "inconclusive": "INCONCLUSIVE"}[out.status]
    p = demo.planted
    judged = [c for c in out.checks if c.kind == p.kind and c.name.startswith(f"{p.metric} ")
              and c.status in ("pass", "fail")] if p is not None else []
    if p is not None and out.status != "fail" and not judged:
        note = (f"the planted {p.metric} failure needs 5 seeds: run the demo without --quick to see it" if quick
                else f"the planted {p.metric} failure was not judged")
        return mark, f"{out.reason}; {note}", ""
    if p is not None and out.status == "pass":
        return "PASSED, not as planted", f"{out.reason}; {p.metric} was meant to fail: {p.why}", ""
    return mark, out.reason, ""


def _docs_line(kinds: list[str]) -> str:
    """``docs/statistics.md``: #repeatability, #seed-stability … (each check's section once)."""
    pages: dict[str, list[str]] = {}
    for k in kinds:
        if k in CHECK_DOCS:
            page, _, anchor = CHECK_DOCS[k].partition("#")
            pages.setdefault(page, [])
            if anchor and f"#{anchor}" not in pages[page]:
                pages[page].append(f"#{anchor}")
    return "; ".join(page + (" " + ", ".join(anchors) if anchors else "") for page, anchors in pages.items())


def summary_lines(studies: Sequence[tuple[Demonstration, Report]], *, url: str, token_path: str,
                  quick: bool = False, color: bool = False) -> list[str]:
    """The demo's last screen: every study with its outcome, what it shows and one line of why, then where to look."""
    def paint(text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if color else text

    n = len(studies)
    lines = [paint(f"Summary: the {n} demo stud{'y' if n == 1 else 'ies'}, what each shows, and its outcome", "1")]
    kinds: list[str] = []
    for demo, report in studies:
        mark, why, cause = outcome_line(demo, report, quick=quick)
        tone = "32" if mark.startswith("PASSED") or mark.endswith("as planted") else (
            "31" if mark.startswith("FAILED") else "33")
        lines.append(f"  Study {report.study.id}  {report.study.name}: {paint(mark, tone)}")
        lines.append(f"    {purpose_line(demo, report, evidence=False)}")
        lines.append(f"    why: {why}")
        if cause:
            lines.append(f"    the cause Steady found: {cause}")
        if demo.planted is not None and mark.endswith("as planted"):
            lines.append(f"    planted: {demo.planted.why}")
        kinds += [c.kind for c in report.outcome.checks if c.kind not in kinds]
    ids = [str(r.study.id) for _, r in studies]
    more = f" (or {', '.join(ids[1:])})" if len(ids) > 1 else ""
    lines += ["", paint("Where to look", "1"),
              f"  Dashboard:   {url}/studies/{ids[0] if ids else ''}   (log in with the token in {token_path})",
              f"  A report:    steady login {url} < {token_path}   then: steady report {ids[0] if ids else ''}{more}",
              f"  API:         {url}/docs",
              f"  The checks:  {_docs_line(kinds)}"]
    return lines
