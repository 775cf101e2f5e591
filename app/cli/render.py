"""The terminal rendering of a study report (``steady report`` and the demo)."""

from __future__ import annotations

import math
from typing import Any

from steady.server.reports.models import Report, SeedStabilityVerdict, Verdict
from steady.server.reports.outcome import FLEET_GUARANTEE, fleet_finding_phrase
from steady.server.reports.parts import (
    Convergence,
    DeterminismCost,
    PairGroup,
    StackGroup,
    VarianceBySource,
)
from steady.server.stats.vocabulary import LEVEL_TITLES, LEVELS, Level, severity
from steady.server.studies.arms import differ_by_phrase
from steady.server.kit.terminal import printable_tree

QUESTIONS: dict[Level, str] = {
    "repeatability": "same seed, same stack: are repeats bitwise identical?",
    "seed_stability": "different seeds: how wide is the band?",
    "stack_portability": "different stacks: equivalent within the margin?",
}
TONE_COLORS = {0: "32", 1: "32", 2: "33", 3: "31"}  # by steady.server.stats.vocabulary.severity


def _color_of(value: str | None) -> str:
    return TONE_COLORS[severity(value)]


def _paint(text: str, code: str | None, color: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if color and code else text


def _group(group: StackGroup | PairGroup) -> str:
    if isinstance(group, PairGroup):
        return f"{group.determinism} / {group.reference_stack} → {group.candidate_stack}"
    return " / ".join(p for p in (group.determinism, group.stack) if p)


def _num(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def render_report(report: Report, *, color: bool = False) -> str:
    # names and reasons come from users: no control characters
    report = Report.model_validate(printable_tree(report.model_dump()))
    study, progress = report.study, report.study.progress
    lines = [_paint(f"Study {study.id}: {study.name}  [{study.status}]", "1", color)]
    lines.append(
        f"  runs judged: {report.n_runs_judged} completed of {progress.total}"
        f" (failed {progress.failed}, still running {progress.running + progress.queued})"
    )
    out = report.outcome
    mark = {"pass": ("PASSED", "32"), "fail": ("FAILED", "31"), "inconclusive": ("INCONCLUSIVE", "33")}[out.status]
    lines.append(f"  outcome: {_paint(mark[0], mark[1], color)}: {out.reason}")
    if report.fleet is not None:  # a fleet check answers in its own section; the levels are not asked
        lines.append("")
        lines.extend(fleet_lines(report, color=color))
        return "\n".join(lines)
    if report.stages:
        lines.append("")
        lines.extend(stage_lines(report, color=color))
    if report.headline:
        lines.append("")
        lines.append(_paint("Expectations", "1", color) + " — did each determinism level do what it should?")
        for h in report.headline:
            mark = {True: ("met", "32"), False: ("NOT met", "31"), None: ("inconclusive", "33")}[h.met]
            line = f"  {h.determinism:<7} expected {h.expected}: {_paint(mark[0], mark[1], color)}"
            if h.met is False:
                line += f" ({h.phrase})"
            lines.append(line)
            for s in h.suspicious:
                lines.append("          " + _paint(f"suspicious: {s}", "31", color))
    for i, level in enumerate(LEVELS, start=1):
        rows = report.of_level(level)
        lines.append("")
        lines.append(_paint(f"{i}. {LEVEL_TITLES[level]}", "1", color) + f" — {QUESTIONS[level]}")
        if not rows:
            lines.append("  (nothing to judge at this level in this study)")
            continue
        width = max(len(f"{v.metric}  {_group(v.group)}") for v in rows)
        for v in rows:
            label = f"{v.metric}  {_group(v.group)}".ljust(width)
            verdict = _paint(f"{v.verdict:<16}", _color_of(v.verdict), color)
            lines.append(f"  {label}  {verdict} n={v.n_runs:<3} {v.summary}")
            lines.append(" " * (width + 4) + v.reason)
            promise = _guarantee(v)
            if promise:
                lines.append(" " * (width + 4) + _paint(f"guarantee: {promise}", "2", color))
            loc = getattr(v, "localization", None)
            if loc is not None:
                lines.append(" " * (width + 4) + f"runs {loc.run_ids[0]} and {loc.run_ids[1]}: {loc.sentence}")
            if isinstance(v.group, PairGroup) and v.group.differ_by is not None:
                lines.append(" " * (width + 4) + differ_by_phrase(v.group.differ_by))
    if report.diverged:
        lines.append("")
        lines.append(_paint("Diverged runs", "1", color) + " (non-finite values; excluded from bands)")
        for d in report.diverged:
            lines.append(f"  run {d.run_id} ({d.determinism}/{d.stack}, seed {d.seed}): "
                         f"{d.metric} non-finite from step {d.step}")
    if report.variance_by_source:
        lines.append("")
        lines.append(_paint("Variance by source", "1", color) + " (final value: between seeds vs nondeterminism)")
        for vs in report.variance_by_source:
            lines.append("  " + _variance_line(vs))
    if report.sources:
        lines.append("")
        lines.extend(sources_lines(report, color=color))
    if report.convergence:
        lines.append("")
        lines.append(_paint("Convergence against a reference", "1", color) + " (MLPerf RCP: steps to target, olympic means)")
        for c in report.convergence:
            lines.extend("  " + line for line in _convergence_lines(c, color))
    if report.determinism_cost:
        lines.append("")
        lines.append(_paint("Cost of determinism", "1", color) + " (step time ratio, with CI)")
        for cost in report.determinism_cost:
            lines.append("  " + _cost_line(cost))
        for text in sorted({c.source_text for c in report.determinism_cost if c.source_text}):
            lines.append(f"  step times from {text}; each run's warm-up (its first"
                         f" {report.determinism_cost[0].warmup_fraction:.0%} of steps) dropped")
    elif report.cost_note:
        lines.append("")
        lines.append(_paint("Cost of determinism", "1", color) + f": not computed: {report.cost_note}")
    if report.resume:
        lines.append("")
        lines.append(_paint("Resume check", "1", color) + " (killed and restarted by the code's own resume path)")
        for r in report.resume:
            hue = {"identical": "32", "within_seed_band": "32", "not_restored": "31", "outside_seed_band": "31"}.get(
                r.verdict, "33")
            lines.append("  " + _paint(f"{r.verdict}: {r.summary}", hue, color))
            if r.verdict != "identical":
                lines.append(f"    {r.reason}")
            if r.guarantee:
                lines.append(f"    ({r.guarantee})")
    if report.caveats:
        lines.append("")
        lines.append(_paint("Caveats", "1", color) + " (what the verdicts above rest on)")
        for caveat in report.caveats:
            lines.append("  " + _paint(caveat.message, "33", color))
    return "\n".join(lines)


def fleet_lines(report: Report, *, color: bool = False) -> list[str]:
    """A fleet check: per stack group, who parts from the majority; who is slow; who did not run; what it could miss."""
    fleet = report.fleet
    assert fleet is not None
    lines = [_paint("Fleet check", "1", color) + f" — {len(fleet.pool)} workers: which one computes differently?"]
    checks = {c.name: c for c in report.outcome.checks}
    for g in fleet.groups:
        lines.append(f"  stack {g.stack} [{g.group}]: workers {', '.join(g.workers)}")
        check = checks.get(f"fleet {g.stack} ({len(g.workers)} workers)")
        if check is not None and g.findings:
            for f in g.findings:
                lines.append("    " + _paint(fleet_finding_phrase(f), "31", color))
            lines.append(f"    the others agree bit for bit: {g.majority_runs} of {g.runs} runs share one result "
                         f"(every step of {fleet.metric} and the weight digests)")
        elif check is not None:
            lines.append("    " + _paint(check.summary, "32" if check.status == "pass" else "33", color))
    group_checks = {f"fleet {g.stack} ({len(g.workers)} workers)" for g in fleet.groups}
    for c in report.outcome.checks:  # slow workers, workers that did not run, the groups compared by TOST
        if c.kind in ("fleet", "fleet_speed") and c.name not in group_checks:
            hue = {"pass": "32", "fail": "31"}.get(c.status, "33")
            lines.append("  " + _paint(c.summary, hue, color))
    sens = fleet.sensitivity
    if sens is not None:
        lines.append("")
        lines.append(_paint("What it could miss", "1", color) + f" — per worker {sens.repeats} runs × "
                     f"{sens.steps_per_run} steps = {sens.steps_per_worker} steps")
        if sens.one_in_seen:
            lines.append(f"  a fault in 1 of {sens.one_in_seen} steps would have been seen with probability "
                         f"{sens.power:.2f}; rarer ones may have been missed")
        lines.append("  " + "; ".join(f"1 in {r.one_in:,} steps: seen with probability {r.probability:.2f}"
                                      for r in sens.rates))
        if sens.plan_one_in and sens.plan_repeats:
            lines.append(f"  to see a fault in 1 of {sens.plan_one_in:,} steps with probability {sens.power:.2f}: "
                         f"{sens.plan_repeats} runs per worker")
        lines.append("  (a run with a wrong step parts from then on; a fault that leaves every logged value and "
                     "digest unchanged is not seen)")
    lines.append("  " + _paint(f"guarantee: {FLEET_GUARANTEE}", "2", color))
    return lines


_SOURCE_VERDICTS = {"equivalent": ("≈ full variance", "32"), "not_equivalent": ("NOT the full variance", "31"),
                    "inconclusive": ("inconclusive", "33")}


def sources_lines(report: Report, *, color: bool = False) -> list[str]:
    """A sources study's table: per source the SD of the final value, its 90% interval, and TOST against all sources."""
    lines = [_paint("Where the variance comes from", "1", color)
             + " (one arm per source, everything else pinned; SD of the final value over runs)"]
    for t in report.sources or []:
        lines.append(f"  {t.metric}: a source is the full variance when its SD is within "
                     f"[{1 / t.margin:.2f}, {t.margin:.2f}] × the all-sources SD (TOST, α = {t.alpha:g}; "
                     "interval: robust 90%, Bonett 2006)")
        seq = next((r.sequential for r in t.rows if r.sequential is not None), None)
        if seq is not None:
            lines.append(f"    in stages: arms grow until each source's TOST decides, at most {seq.max_runs} runs per arm "
                         f"in {seq.last_stage} stages ({_spending(seq.spending)} alpha spending: each claim "
                         f"≤ {t.alpha:g} over all stages); SD / all and the verdict at the stage that decided")
        lines.append(f"    {'source':<32} {'n':>4}  {'SD':>10}  {'90% interval':>23}  {'SD / all':>8}  verdict")
        rows = [*t.rows, *([t.all_sources] if t.all_sources else [])]
        for r in rows:
            name = r.label if r.source != "all" else "all sources"
            if r.status != "measured":
                lines.append(f"    {name:<32} {r.n:>4}  {'not varied' if r.status == 'not_varied' else 'too few runs':>10}"
                             f"  {r.note}")
                continue
            interval = f"[{_num(r.sd_lower)}, {_num(r.sd_upper)}]"
            if r.vs_all is None:
                lines.append(f"    {name:<32} {r.n:>4}  {_num(r.sd):>10}  {interval:>23}")
                continue
            word, code = _SOURCE_VERDICTS[r.vs_all.verdict]
            extra = f" (about {r.runs_needed} runs per arm would decide)" if r.runs_needed else ""
            if r.sequential is not None and r.sequential.looks:
                look = next((x for x in r.sequential.looks if x.stage == r.sequential.decided_at),
                            r.sequential.looks[-1])
                where = f" at stage {look.stage} ({look.n_source} + {look.n_all} runs)"
                if r.sequential.verdict == "inconclusive":
                    where += ("; stopped by the time budget" if r.sequential.stopped
                              else "; budget spent" if r.sequential.final else "; more runs come")
                extra = where + (f"; about {r.runs_needed} runs per arm would decide at one look"
                                 if r.runs_needed and r.sequential.final else "")
            lines.append(f"    {name:<32} {r.n:>4}  {_num(r.sd):>10}  {interval:>23}  {_num(r.vs_all.ratio):>8}  "
                         + _paint(word, code, color) + extra)
        if t.crossed:
            c = t.crossed
            parts = [f"{v.name} {_num(v.variance)} [{_num(v.lower)}, {_num(v.upper)}]" for v in c.components]
            lines.append(f"    crossed init × data ({c.n_init} × {c.n_data} runs), variance components with "
                         f"{c.confidence:.0%} intervals: " + "; ".join(parts))
        if t.divergence:
            d = t.divergence
            when = (f"half the band at step {d.first_half}" if d.first_half is not None else "never half the band")
            full = (f", the full band at step {d.first_full}" if d.first_full is not None else ", never the full band")
            lines.append(f"    one-ULP change vs its unperturbed twin: {when}{full}; at the end "
                         f"{_num(d.final)} × the distance of two independent runs")
            if d.absorbed:
                lines.append(f"    {d.absorbed} of {d.n_runs} one-ULP runs never left their twin ({t.metric} equal at every "
                             "step): the change was absorbed by rounding or fed a unit that never reaches the loss, so "
                             "that arm is a mixture and its SD understates what a change that takes hold does")
    return lines


def _num6(x: Any) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _convergence_lines(c: Convergence, color: bool) -> list[str]:
    """One ``convergence`` entry of the report (``steady.server.stats.convergence.ConvergenceResult`` plus its group)."""
    op = "≤" if c.direction == "min" else "≥"
    ref = c.reference
    source = f"study {ref.study}" if ref.source == "study" else "given"
    head = (f"{c.metric} {op} {_num6(c.target)}  {_group(c.group)}  "
            + _paint(f"{c.verdict:<12}", _color_of(c.verdict), color)
            + f" runs={c.n_candidate_runs}")
    lines = [head, "  " + c.reason]
    if ref.mean is not None:
        nums = f"  reference ({source}): mean {_num6(ref.mean)}, sd {_num6(ref.std)}, n={ref.n}"
        if c.min_acceptable_mean is not None:
            nums += (f"; candidate mean {_num6(c.candidate_mean)} (n={c.n_candidate}), minimum acceptable "
                     f"{_num6(c.min_acceptable_mean)}, max speed-up ×{c.max_speedup:.4f}, "
                     f"normalisation ×{c.normalization_factor:.4f}")
        lines.append(nums)
    if c.n_unconverged:
        lines.append(f"  {c.n_unconverged} run(s) never reached the target")
    if c.guarantee:
        lines.append("  " + _paint(f"guarantee: {c.guarantee}", "2", color))
    return lines


def stage_lines(report: Report, *, color: bool = False) -> list[str]:
    """The stages of an adaptive study: per stage, its seeds and what each sequential verdict did."""
    seq = report.options.sequential
    stages = report.stages
    last = seq.last_stage if seq else "?"
    out = [_paint("Adaptive seeds", "1", color) + f" — stage {stages[-1].stage} of at most {last}, "
           f"{_spending(seq.spending if seq else None)} alpha spending, at most {seq.max_seeds if seq else '?'} seeds"]
    for s in stages:
        seeds = s.seeds
        span = f"{seeds[0]}..{seeds[-1]}" if len(seeds) > 2 else ", ".join(map(str, seeds))
        out.append(f"  stage {s.stage}: +{len(seeds)} seeds ({span}) → {s.outcome or 'running'}")
        for d in s.decisions:
            if d.error is not None:
                out.append(f"    {d.error}")
                continue
            z = d.boundary
            bound = "not testable" if z is None or math.isinf(z) else f"|z| ≥ {z:.3f}"
            stat = "" if d.std is None else f"std {_num(d.std)}"
            if d.upper is not None:
                stat += f" in [{_num(d.lower)}, {_num(d.upper)}]"
            decision = _paint(str(d.decision), _color_of(d.decision), color)
            if d.decided_at and d.decided_at != s.stage:
                decision += f" (decided at stage {d.decided_at})"
            if d.level == "sources":  # a source's SD against all sources: the stage's interval of the ratio
                ratio = "" if d.ratio is None else f"SD ratio {_num(d.ratio)} in [{_num(d.lower)}, {_num(d.upper)}]"
                out.append(f"    {d.metric}  {d.candidate_stack} vs all: n={d.n_candidate}+{d.n_reference} "
                           f"t={_num(d.info_fraction)} boundary {bound}: {ratio} → {decision}")
                continue
            if d.level == "stack_portability":  # a group-sequential TOST: the stage's CI of the difference
                ci = "" if d.diff is None else f"Δmean {_num(d.diff)} in [{_num(d.ci_low)}, {_num(d.ci_high)}]"
                out.append(f"    {d.metric}  {d.determinism} / {d.candidate_stack} vs {d.reference_stack}: "
                           f"n={d.n_reference}+{d.n_candidate} t={_num(d.info_fraction)} boundary {bound}: {ci} "
                           f"→ {decision}")
                continue
            group = f"{d.determinism} / {d.stack}" if d.stack else str(d.determinism or "")
            out.append(f"    {d.metric}  {group}: n={d.n_seeds} t={_num(d.info_fraction)}"
                       f" boundary {bound}: {stat} → {decision}")
    return out


def _spending(name: Any) -> str:
    return {"pocock": "Pocock-type", "obrien_fleming": "O'Brien–Fleming-type"}.get(name, str(name))


def _guarantee(v: Verdict) -> str:
    """The verdict's false-alarm level in one phrase (plus the out-of-band test's, for seed stability)."""
    parts = [v.guarantee] if v.guarantee else []
    if isinstance(v, SeedStabilityVerdict) and v.out_of_band_test is not None and v.out_of_band_test.guarantee:
        parts.append(f"out-of-band runs: {v.out_of_band_test.guarantee}")
    return "; ".join(parts)


def _variance_line(v: VarianceBySource) -> str:
    """One ``variance_by_source`` entry of the report (components of a VarianceComponents)."""
    text = f"{v.metric}  {_group(v.group)}: "
    c = v.components
    if not v.available or c is None:
        return text + f"not available ({v.reason or 'too few runs'})"
    if v.between_seed_applies is False:
        return text + f"run-to-run var {_num(c.between + c.within)}; {v.note}"
    if not math.isfinite(c.share_within):  # no variance at all: every run gave the same value
        return text + "no variance to split: every run's final value is identical (between-seed and within-seed var 0)"
    return (text + f"nondeterminism share {c.share_within * 100:.1f}%"
            f"  (between-seed var {_num(c.between)}, within-seed var {_num(c.within)})")


def _cost_line(c: DeterminismCost) -> str:
    """One ``determinism_cost`` entry of the report (a CostRatio with its stack)."""
    text = f"{c.numerator} / {c.denominator} ({c.stack})"
    if math.isnan(c.ratio):
        return text + ": not available"
    if c.summary:
        text += f": {c.summary}"
    else:  # a report from before the summary: the ratio with its interval
        text += f": ×{c.ratio:.3f}"
        if c.ci_low is not None and c.ci_high is not None:
            text += f" ({c.confidence:.0%} CI {c.ci_low:.3f}–{c.ci_high:.3f})"
    if c.verdict is not None and c.budget is not None:
        text += f"  {c.verdict} against budget ×{c.budget:g}"
        if c.guarantee:
            text += f" ({c.guarantee})"
    return text
