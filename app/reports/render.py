"""The terminal rendering of a study report (``steady report`` and the demo)."""

from __future__ import annotations

from typing import Any

from app.studies.arms import differ_by_phrase
from app.terminal import printable_tree

LEVELS = (
    ("repeatability", "1. Repeatability", "same seed, same stack: are repeats bitwise identical?"),
    ("seed_stability", "2. Seed stability", "different seeds: how wide is the band?"),
    ("stack_portability", "3. Stack portability", "different stacks: equivalent within the margin?"),
)

COLORS = {
    "identical": "32", "within_tolerance": "32", "stable": "32", "equivalent": "32",
    "out_of_tolerance": "31", "unstable": "31", "not_equivalent": "31",
    "inconclusive": "33",
}


def _paint(text: str, code: str | None, color: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if color and code else text


def _group(group: dict[str, Any]) -> str:
    parts = [str(group.get("determinism", ""))]
    stack = group.get("stack") or (
        f"{group.get('reference_stack')} → {group.get('candidate_stack')}" if "candidate_stack" in group else None
    )
    if stack:
        parts.append(str(stack))
    return " / ".join(p for p in parts if p)


def _num(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def render_report(report: dict[str, Any], *, color: bool = False) -> str:
    report = printable_tree(report)  # names and reasons come from users: no control characters
    study = report.get("study", {})
    lines = []
    progress = study.get("progress", {})
    head = f"Study {study.get('id')}: {study.get('name')}  [{study.get('status')}]"
    lines.append(_paint(head, "1", color))
    lines.append(
        f"  runs judged: {report.get('n_runs_judged', 0)} completed of {progress.get('total', 0)}"
        f" (failed {progress.get('failed', 0)}, still running {progress.get('running', 0) + progress.get('queued', 0)})"
    )
    stages = report.get("stages") or []
    if stages:
        lines.append("")
        lines.extend(stage_lines(report, color=color))
    headline = report.get("headline") or []
    if headline:
        lines.append("")
        lines.append(_paint("Expectations", "1", color) + " — did each determinism level do what it should?")
        for h in headline:
            mark = {True: ("met", "32"), False: ("NOT met", "31"), None: ("inconclusive", "33")}[h.get("met")]
            line = f"  {h['determinism']:<7} expected {h['expected']}: {_paint(mark[0], mark[1], color)}"
            if h.get("met") is False:
                line += f" ({h.get('phrase')})"
            lines.append(line)
            for s in h.get("suspicious") or []:
                lines.append("          " + _paint(f"suspicious: {s}", "31", color))
    verdicts = report.get("verdicts", [])
    for level, title, question in LEVELS:
        rows = [v for v in verdicts if v.get("level") == level]
        lines.append("")
        lines.append(_paint(title, "1", color) + f" — {question}")
        if not rows:
            lines.append("  (nothing to judge at this level in this study)")
            continue
        width = max(len(f"{v['metric']}  {_group(v['group'])}") for v in rows)
        for v in rows:
            label = f"{v['metric']}  {_group(v['group'])}".ljust(width)
            verdict = _paint(f"{v['verdict']:<16}", COLORS.get(v["verdict"]), color)
            lines.append(f"  {label}  {verdict} n={v.get('n_runs', 0):<3} {v.get('reason', '')}")
            promise = _guarantee(v)
            if promise:
                lines.append(" " * (width + 4) + _paint(f"guarantee: {promise}", "2", color))
            if (v.get("group") or {}).get("differ_by") is not None:
                lines.append(" " * (width + 4) + differ_by_phrase(v["group"]["differ_by"]))
    diverged = report.get("diverged") or []
    if diverged:
        lines.append("")
        lines.append(_paint("Diverged runs", "1", color) + " (non-finite values; excluded from bands)")
        for d in diverged:
            lines.append(
                f"  run {d.get('run_id')} ({d.get('determinism')}/{d.get('stack')}, seed {d.get('seed')}): "
                f"{d.get('metric')} non-finite from step {d.get('step')}"
            )
    variance = report.get("variance_by_source") or []
    if variance:
        lines.append("")
        lines.append(_paint("Variance by source", "1", color) + " (final value: between seeds vs nondeterminism)")
        for v in variance:
            lines.append("  " + _variance_line(v))
    convergence = report.get("convergence") or []
    if convergence:
        lines.append("")
        lines.append(_paint("Convergence against a reference", "1", color) + " (MLPerf RCP: steps to target, olympic means)")
        for c in convergence:
            lines.extend("  " + line for line in _convergence_lines(c, color))
    cost = report.get("determinism_cost") or []
    if cost:
        lines.append("")
        lines.append(_paint("Cost of determinism", "1", color) + " (step time ratio, with CI)")
        for c in cost:
            lines.append("  " + _cost_line(c))
    return "\n".join(lines)


def _num6(x: Any) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


CONVERGENCE_COLORS = {"pass": "32", "fail": "31", "inconclusive": "33"}


def _convergence_lines(c: dict[str, Any], color: bool) -> list[str]:
    """One ``convergence`` entry of the report (``app.stats.convergence.ConvergenceResult`` plus its group)."""
    op = "≤" if c.get("direction") == "min" else "≥"
    ref = c.get("reference") or {}
    source = f"study {ref.get('study')}" if ref.get("source") == "study" else "given"
    head = (f"{c['metric']} {op} {_num6(c['target'])}  {_group(c.get('group') or {})}  "
            + _paint(f"{c['verdict']:<12}", CONVERGENCE_COLORS.get(c["verdict"]), color)
            + f" runs={c.get('n_candidate_runs', 0)}")
    lines = [head, "  " + str(c.get("reason", ""))]
    if ref.get("mean") is not None:
        nums = (f"  reference ({source}): mean {_num6(ref['mean'])}, sd {_num6(ref['std'])}, n={ref['n']}")
        if c.get("min_acceptable_mean") is not None:
            nums += (f"; candidate mean {_num6(c['candidate_mean'])} (n={c['n_candidate']}), minimum acceptable "
                     f"{_num6(c['min_acceptable_mean'])}, max speed-up ×{float(c['max_speedup']):.4f}, "
                     f"normalisation ×{float(c['normalization_factor']):.4f}")
        lines.append(nums)
    if c.get("n_unconverged"):
        lines.append(f"  {c['n_unconverged']} run(s) never reached the target")
    if c.get("guarantee"):
        lines.append("  " + _paint(f"guarantee: {c['guarantee']}", "2", color))
    return lines


def stage_lines(report: dict[str, Any], *, color: bool = False) -> list[str]:
    """The stages of an adaptive study: per stage, its seeds and what each seed-stability verdict did."""
    seq = (report.get("options") or {}).get("sequential") or {}
    stages = report.get("stages") or []
    last = seq.get("last_stage", "?")
    out = [_paint("Adaptive seeds", "1", color) + f" — stage {stages[-1]['stage']} of at most {last}, "
           f"{_spending(seq.get('spending'))} alpha spending, at most {seq.get('max_seeds', '?')} seeds"]
    for s in stages:
        seeds = s.get("seeds") or []
        span = f"{seeds[0]}..{seeds[-1]}" if len(seeds) > 2 else ", ".join(map(str, seeds))
        out.append(f"  stage {s['stage']}: +{len(seeds)} seeds ({span}) → {s.get('outcome') or 'running'}")
        for d in s.get("decisions") or []:
            if "error" in d:
                out.append(f"    {d['error']}")
                continue
            bound = d.get("boundary")
            bound = "not testable" if bound in (None, "Infinity") else f"|z| ≥ {float(bound):.3f}"
            stat = "" if d.get("std") is None else f"std {_num(d['std'])}"
            if d.get("upper") is not None:
                stat += f" in [{_num(d['lower'])}, {_num(d['upper'])}]"
            decision = _paint(str(d.get("decision")), COLORS.get(d.get("decision")), color)
            if d.get("decided_at") and d["decided_at"] != s["stage"]:
                decision += f" (decided at stage {d['decided_at']})"
            out.append(f"    {d.get('metric')}  {_group(d)}: n={d.get('n_seeds')} t={_num(d.get('info_fraction'))}"
                       f" boundary {bound}: {stat} → {decision}")
    return out


def _spending(name: Any) -> str:
    return {"pocock": "Pocock-type", "obrien_fleming": "O'Brien–Fleming-type"}.get(name, str(name))


def _guarantee(v: dict[str, Any]) -> str:
    """The verdict's false-alarm level in one phrase (plus the out-of-band test's, for seed stability)."""
    parts = [v["guarantee"]] if v.get("guarantee") else []
    oob = v.get("out_of_band_test") or {}
    if oob.get("guarantee"):
        parts.append(f"out-of-band runs: {oob['guarantee']}")
    return "; ".join(parts)


def _variance_line(v: dict[str, Any]) -> str:
    """One ``variance_by_source`` entry of ``app.stats.report`` (components of a VarianceComponents)."""
    text = f"{v['metric']}  {_group(v['group'])}: "
    if not v.get("available"):
        return text + f"not available ({v.get('reason', 'too few runs')})"
    c = v["components"]
    if v.get("between_seed_applies") is False:
        return text + f"run-to-run var {_num(float(c['between']) + float(c['within']))}; {v.get('note')}"
    return (text + f"nondeterminism share {float(c['share_within']) * 100:.1f}%"
            f"  (between-seed var {_num(c['between'])}, within-seed var {_num(c['within'])})")


def _cost_line(c: dict[str, Any]) -> str:
    """One ``determinism_cost`` entry of ``app.stats.report`` (a CostRatio with its stack)."""
    text = f"{c['numerator']} / {c['denominator']} ({c['stack']})"
    if c.get("ratio") is None:
        return text + ": not available"
    text += f": ×{float(c['ratio']):.3f}"
    if c.get("ci_low") is not None and c.get("ci_high") is not None:
        level = f"{float(c['confidence']):.0%} " if c.get("confidence") is not None else ""
        text += f" ({level}CI {float(c['ci_low']):.3f}–{float(c['ci_high']):.3f})"
    if c.get("verdict") is not None and c.get("budget") is not None:
        text += f"  {c['verdict']} against budget ×{float(c['budget']):g}"
        if c.get("guarantee"):
            text += f" ({c['guarantee']})"
    return text
