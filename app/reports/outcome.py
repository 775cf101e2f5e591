"""One failure policy: whether a study passes, fails or is inconclusive, and why, decided once.

``judge`` turns a report into its checks (one per level expectation, verdict, cost-of-determinism
budget and convergence group) and the ``Outcome`` they give. The report carries it (``Report.outcome``),
so ``steady report``, ``steady submit --wait``, ``steady check``, the dashboard's badges and the
Prometheus export present the same judgment with the same reason instead of each deciding anew:

* a repeatability verdict passes when its level met its expectation (``steady.server.stats.expectations``:
  at ``none`` repeats may differ), an expectation the same way;
* any other verdict passes when it is good or within tolerance, fails when it is bad (``unstable``,
  ``seed_has_no_effect``, ``not_equivalent``, a cost or convergence ``fail``), else is inconclusive;
* a sources study's question is answered per source: a source whose TOST against all sources decided
  (the full variance, or not) passes, an undecided one is inconclusive;
* a study that failed (every run failed, or no run logged its metrics) fails with the reason the study
  ended on, whatever its verdicts;
* only what the spec asks decides: a check with nothing to judge against (seed stability without a
  ``max_std``, stack portability without a ``margin``, repeatability when the spec runs each seed once) or
  not asked by the study's kind (the arms of a sources study compared by their means) is ``not_asked``:
  shown, with why, as information, never the outcome;
* the study fails when one check fails, is inconclusive when none fails and one is inconclusive
  (or nothing asked can be judged), and passes otherwise. The reason is the first failing (else
  inconclusive) check's plain first line.

Reads the report duck-typed (``level``, ``verdict``, ``summary`` …; a ``steady.server.reports.models.Report``),
so ``models`` can judge a report as it is read without the two modules importing each other.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from steady.server.reports.parts import Part
from steady.server.stats.vocabulary import severity

__all__ = ["PASS", "FAIL", "INCONCLUSIVE", "NOT_ASKED", "Check", "Outcome", "judge", "checks", "combine",
           "verdict_status", "group_label"]

PASS, FAIL, INCONCLUSIVE, NOT_ASKED = "pass", "fail", "inconclusive", "not_asked"
Status = Literal["pass", "fail", "inconclusive"]
CheckStatus = Literal["pass", "fail", "inconclusive", "not_asked"]  # not_asked: information, never the outcome
_EXPECTATION_STATUS: dict[bool | None, Status] = {True: "pass", False: "fail", None: "inconclusive"}
_RESUME_STATUS: dict[str, Status] = {"identical": "pass", "within_seed_band": "pass", "not_restored": "fail",
                                     "outside_seed_band": "fail"}  # failed, not_judged: inconclusive


class Check(Part):
    """One thing the study is judged on: a level's expectation, a verdict, a cost budget, a convergence group."""

    kind: str  # study | expectation | repeatability | seed_stability | stack_portability | sources | determinism_cost
    #            | convergence | resume
    name: str
    status: CheckStatus  # not_asked: the spec gives it nothing to judge against, or the study's kind does not ask it
    summary: str  # the plain first line: what it means and what to do (not_asked: why it does not decide)
    reason: str  # the statistics behind it
    guarantee: str  # the decision's stated false-alarm level, in words ("" when it has none)


class Outcome(Part):
    """The study's judgment: ``status`` and the one ``reason`` every view quotes, with the checks behind it."""

    status: Status
    reason: str
    checks: list[Check]


def verdict_status(verdict: str | None) -> Status:
    """Good and within-tolerance values pass, bad ones fail; anything else is inconclusive, never a pass."""
    return {0: "pass", 1: "pass", 3: "fail"}.get(severity(verdict), "inconclusive")  # type: ignore[return-value]


def group_label(group: Any) -> str:
    if getattr(group, "candidate_stack", None) is not None:
        return f"{group.determinism}/{group.candidate_stack} vs {group.reference_stack or 'reference'}"
    return "/".join(p for p in (group.determinism, getattr(group, "stack", None)) if p)


def _guarantee(v: Any) -> str:
    parts = [v.guarantee] if v.guarantee else []
    oob = getattr(v, "out_of_band_test", None)
    if oob is not None and oob.guarantee:
        parts.append(f"out-of-band runs: {oob.guarantee}")
    return "; ".join(parts)


def _number(x: float | None, fmt: str = ".6g") -> str:
    return "n/a" if x is None else format(x, fmt)


def _convergence_check(c: Any) -> Check:
    """A convergence check (MLPerf RCP rule): the numbers a reviewer needs to see why it passed or
    failed, whatever the reason's wording: candidate mean, floor, allowed speed-up, normalisation."""
    name = f"steps to {c.metric}{'<=' if c.direction == 'min' else '>='}{c.target:g} {group_label(c.group)}"
    numbers = (f"candidate mean {_number(c.candidate_mean)} steps; minimum acceptable mean "
               f"{_number(c.min_acceptable_mean)}; max speed-up ×{_number(c.max_speedup, '.4f')}; "
               f"normalisation factor ×{_number(c.normalization_factor, '.4f')}")
    return Check(kind="convergence", name=name, status=verdict_status(c.verdict), summary=f"{c.verdict}: {c.reason}",
                 reason=f"{c.verdict}: {c.reason} ({numbers})", guarantee=c.guarantee)


def _not_asked(check: Check, why: str) -> Check:
    """``check`` as information: its plain line says ``why`` it does not decide; its reason keeps what it showed."""
    return check.model_copy(update={"status": NOT_ASKED, "summary": f"not asked: {why}"})


def _repeats_not_asked(report: Any) -> str:
    """Why repeatability is not asked (``""`` when it is): the spec runs each seed once."""
    repeats = getattr(report.study, "repeats", None)
    if repeats is None or repeats >= 2:
        return ""
    return "the spec runs each seed once (repeats: 1), so there are no repeats of a seed to compare"


def _study_check(report: Any) -> list[Check]:
    """A study that failed (every run failed, or no run logged its metrics) fails, for the reason it ended on."""
    if report.study.status != "failed":
        return []
    why = getattr(report.study, "status_reason", None) or "every run failed"
    return [Check(kind="study", name="study", status="fail", summary=why,
                  reason=f"the study failed: {why}", guarantee="")]


_SOURCE_WORDS = {"equivalent": "about the full variance", "not_equivalent": "not the full variance",
                 "inconclusive": "cannot tell yet"}


def _sources_checks(report: Any) -> list[Check]:
    """A sources study's answers: per source, whether its SD is the full (all-sources) SD, by TOST."""
    out: list[Check] = []
    for t in report.sources or ():
        band = f"[{1 / t.margin:.3g}, {t.margin:.3g}]"
        guarantee = f"TOST at α = {t.alpha:g}: a false 'the full variance' at most {t.alpha * 100:.3g}% of the time"
        for r in t.rows:
            name = f"{t.metric} {r.source} vs all sources"
            if r.status == "not_varied":
                check = Check(kind="sources", name=name, status="inconclusive", summary=r.note or "not varied",
                              reason=r.note or "not varied", guarantee="")
                out.append(_not_asked(check, f"the code never reads the {r.source} seed, so this arm varies nothing"))
                continue
            v = r.vs_all
            if r.status != "measured" or v is None:
                line = f"too few runs to compare the {r.source} arm with all sources" + (f": {r.note}" if r.note else "")
                out.append(Check(kind="sources", name=name, status="inconclusive", summary=line, reason=line,
                                 guarantee=""))
                continue
            if all(math.isfinite(x) for x in (v.ratio, v.lower, v.upper)):
                ratio = (f"SD ratio {v.ratio:.3g} ({(1 - 2 * t.alpha) * 100:.3g}% CI {v.lower:.3g}–{v.upper:.3g}) against "
                         f"{band}")
            else:  # a zero SD is exact: no ratio to draw an interval around
                ratio = "no SD ratio: " + ("both this arm's and all sources' runs are all equal" if math.isnan(v.ratio)
                                           else "all sources' runs are all equal" if v.ratio > 0
                                           else "this arm's runs are all equal (SD 0)")
            more = f"; about {r.runs_needed} runs per arm would decide" if v.verdict == "inconclusive" and r.runs_needed \
                else ""
            line = f"{_SOURCE_WORDS.get(v.verdict, v.verdict)}: {ratio}{more}"
            status: Status = "inconclusive" if v.verdict == "inconclusive" else "pass"  # decided either way: answered
            out.append(Check(kind="sources", name=name, status=status, summary=line,
                             reason=f"{v.verdict}: TOST p = {v.p_value:.3g}, {r.n} runs of the {r.source} arm",
                             guarantee=guarantee))
    return out


FLEET_GUARANTEE = ("a worker is named only when a run of it parts bit for bit from the result most of its stack "
                   "group's runs share: no false alarm where healthy devices repeat the workload bit for bit at strict")
_FLEET_NOT_ASKED = ("a fleet check compares each worker's runs with its stack group's majority (the fleet section), "
                    "not every run with every other")


def _steps_phrase(f: Any) -> str:
    if f.first_step is None:
        return "every logged value equal, the " + " and ".join(d.replace("_", " ") for d in f.digests) + " digest differs"
    return f"from step {f.first_step} ({f.metric})"


def fleet_finding_phrase(f: Any) -> str:
    """One named worker in words: who, where its runs part, how many, consistent or intermittent."""
    if f.kind == "consistent":
        how = "consistently (every run of it parts, all alike)" if f.runs > 1 else "(one run: consistent or not, untold)"
    elif f.parted < f.runs:
        how = "intermittently (its other runs agree with the group)"
    else:
        how = "intermittently (its runs disagree with each other)"
    return f"worker {f.worker}: {f.parted} of {f.runs} runs part {_steps_phrase(f)}, {how}"


def _fleet_checks(fleet: Any) -> list[Check]:
    """A fleet check's answers: per stack group, who parts from its majority; who is slow; who did not run; and
    between groups, the TOST of the final value."""
    out: list[Check] = []
    for g in fleet.groups:
        name = f"fleet {g.stack} ({len(g.workers)} workers)"
        if not g.has_majority:
            line = (f"no result is shared by more than half of the group's {g.runs} runs: the workload is not "
                    "bit-repeatable on these workers, or most of them part; no worker is named")
            out.append(Check(kind="fleet", name=name, status="inconclusive", summary=line, reason=line,
                             guarantee=FLEET_GUARANTEE))
        elif g.findings:
            line = "; ".join(fleet_finding_phrase(f) for f in g.findings)
            reason = (f"{line} (the majority: {g.majority_runs} of {g.runs} runs, equal bit for bit in every step of "
                      f"{fleet.metric} and the weight digests)")
            out.append(Check(kind="fleet", name=name, status="fail", summary=line, reason=reason,
                             guarantee=FLEET_GUARANTEE))
        else:
            line = (f"all {len(g.workers)} workers agree bit for bit: {g.runs} runs equal in every step of "
                    f"{fleet.metric} and the weight digests")
            out.append(Check(kind="fleet", name=name, status="pass", summary=line, reason=line,
                             guarantee=FLEET_GUARANTEE))
    for s in fleet.slow:
        line = (f"worker {s.worker} is slow, not wrong: median step time ×{s.ratio:.3g} its group's other workers' "
                f"({s.median_s * 1e3:.3g} ms against {s.others_median_s * 1e3:.3g} ms)")
        out.append(Check(kind="fleet_speed", name=f"step time of {s.worker}", status="fail", summary=line,
                         reason=f"{line}; one-sided Mann–Whitney p = {s.p_value:.2g} < {s.threshold:.2g}",
                         guarantee=f"named when ×{fleet.slow_ratio:g} or more and the test rejects at "
                         f"{fleet.alpha:g} over the group's workers (Bonferroni)"))
    for m in fleet.missing:
        line = f"worker {m.worker} completed {m.completed} of {m.asked} runs" + (f": {m.reason}" if m.reason else "")
        out.append(Check(kind="fleet", name=f"runs of {m.worker}", status="inconclusive", summary=line, reason=line,
                         guarantee=""))
    for a in fleet.across:
        name = f"fleet {a.candidate_group} vs {a.reference_group}"
        if a.verdict == "not_asked":
            line = (f"the stacks differ, so final {a.metric} values are compared by TOST, not bit for bit; "
                    f"the spec gives {a.metric} no margin")
            out.append(_not_asked(Check(kind="fleet", name=name, status="inconclusive", summary=line, reason=line,
                                        guarantee=""), line))
            continue
        numbers = "" if a.diff is None else f" (difference {a.diff:.3g}, TOST p = {a.p_value:.3g})"
        line = (f"stacks differ, so compared by TOST on the final {a.metric}, not bit for bit: "
                f"{a.verdict.replace('_', ' ')} within ±{a.margin:g}{numbers}")
        status: Status = {"equivalent": "pass", "not_equivalent": "fail"}.get(a.verdict, "inconclusive")  # type: ignore[assignment]
        out.append(Check(kind="fleet", name=name, status=status, summary=line, reason=line,
                         guarantee=f"TOST at α = {a.alpha:g}: a false 'equivalent' at most {a.alpha * 100:.3g}% of the time"))
    return out


def checks(report: Any) -> list[Check]:
    """The report as checks, in report order (see the module's docstring for the rules)."""
    out: list[Check] = _study_check(report)
    fleet = getattr(report, "fleet", None)
    if fleet is not None:  # the fleet section answers; the levels' checks compare runs of different workers
        return out + [_not_asked(c, _FLEET_NOT_ASKED) for c in _level_checks(report)] + _fleet_checks(fleet)
    return out + _level_checks(report)


def _level_checks(report: Any) -> list[Check]:
    out: list[Check] = []
    sources_study = report.sources is not None
    no_repeats = _repeats_not_asked(report)
    for h in report.headline:
        promise = next((v.guarantee for v in report.of_level("repeatability")
                        if v.group.determinism == h.determinism and v.guarantee), "")
        reason = h.phrase + ("; suspicious: " + "; ".join(h.suspicious) if h.suspicious else "")
        mark = {True: "met", False: "NOT met", None: "not enough repeats to tell"}[h.met]
        said = h.phrase.removeprefix("met: ")  # the headline's phrase may start with the mark already
        summary = f"{h.determinism} expectation {mark}" + ("" if said == mark else f": {said}")
        check = Check(kind="expectation", name=f"{h.determinism}: {h.expected}",
                      status=_EXPECTATION_STATUS[h.met], summary=summary, reason=reason, guarantee=promise)
        out.append(_not_asked(check, no_repeats) if no_repeats and (sources_study or h.met is None) else check)
    for v in report.verdicts:
        name = f"{v.metric} {group_label(v.group)}"
        if v.level == "repeatability":
            status = _EXPECTATION_STATUS[v.met_expectation]
            reason = f"{v.verdict}: {v.reason} (expected: {v.expectation})"
        else:
            status, reason = verdict_status(v.verdict), f"{v.verdict}: {v.reason}"
        check = Check(kind=v.level, name=name, status=status, summary=v.summary or reason, reason=reason,
                      guarantee=_guarantee(v))
        why = ""
        if v.level == "repeatability" and no_repeats and (sources_study or v.verdict == "inconclusive"):
            why = no_repeats
        elif v.level == "seed_stability" and status == INCONCLUSIVE and v.spread.max_std is None:
            why = f"nothing to judge against: the spec gives {v.metric} no max_std"
        elif v.level == "stack_portability" and sources_study:
            why = ("a sources study compares each source's SD with the all-sources SD (the table of sources), "
                   "not the means of its arms")
        elif v.level == "stack_portability" and status == INCONCLUSIVE and v.margin is None:
            why = f"nothing to judge against: the spec gives {v.metric} no margin"
        out.append(_not_asked(check, why) if why else check)
    out += _sources_checks(report)
    for c in report.determinism_cost:
        if c.verdict is None:  # no budget given: a measurement, not a check
            continue
        name = f"step time {c.numerator}/{c.denominator} {c.stack}".rstrip()
        reason = c.reason or f"{c.verdict}: ratio {c.ratio} (CI {c.ci_low}..{c.ci_high}) against budget ×{c.budget}"
        out.append(Check(kind="determinism_cost", name=name, status=verdict_status(c.verdict),
                         summary=f"{c.verdict}: step time ×{c.ratio:.3g} against the budget ×{c.budget:g}"
                         if c.budget is not None else reason, reason=reason, guarantee=c.guarantee))
    out += [_convergence_check(c) for c in report.convergence or ()]
    for r in getattr(report, "resume", None) or ():
        judged: Status = _RESUME_STATUS.get(r.verdict, "inconclusive")
        out.append(Check(kind="resume", name=f"resume {r.determinism}/{r.stack} seed {r.seed}", status=judged,
                         summary=r.summary, reason=r.reason, guarantee=r.guarantee))
    return out


def combine(items: list[Check]) -> Outcome:
    """The outcome of ``items``: the first failing check decides, else the first inconclusive one; a
    ``not_asked`` check never does."""
    for status in (FAIL, INCONCLUSIVE):
        hits = [c for c in items if c.status == status]
        if hits:
            more = f" (and {len(hits) - 1} more {'failing' if status == FAIL else 'inconclusive'} check(s))" \
                if len(hits) > 1 else ""
            return Outcome(status=status, reason=f"{hits[0].name}: {hits[0].summary}{more}", checks=items)
    asked = [c for c in items if c.status != NOT_ASKED]
    if not asked:
        first = next((c for c in items if c.status == NOT_ASKED), None)
        reason = ("nothing to judge: no verdict in the report" if first is None else
                  f"nothing asked that this study can judge: {first.name}: {first.summary.removeprefix('not asked: ')}")
        return Outcome(status="inconclusive", reason=reason, checks=items)
    shown = len(items) - len(asked)
    return Outcome(status="pass", reason=("the one check asked passed" if len(asked) == 1 else
                                          f"all {len(asked)} checks passed") + (
        f" ({shown} more shown as information, not asked)" if shown else ""), checks=items)


def judge(report: Any) -> Outcome:
    """The study's outcome (the policy every gate and view presents)."""
    return combine(checks(report))
