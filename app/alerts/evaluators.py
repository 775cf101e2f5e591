"""The evaluators: one per rule kind, each reading the study's report (and the suite's baseline
and history) and returning its findings. The statistics are the stats core's
(``steady.server.stats.alert_rules``, ``steady.server.stats.changepoint``); what is here picks the verdicts a rule
watches and words the finding."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import defaultdict
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from steady.server.alerts import baselines, repository
from steady.server.alerts.findings import BAD, OK, UNKNOWN, Evaluation, Finding
from steady.server.alerts.rules import rule_spec
from steady.server.kit.db import unavailable
from steady.server.models import Study, SuiteBaseline
from steady.server.kit import wire
from steady.server.reports import service as reports
from steady.server.reports.models import Report, typed_verdicts, verdicts_of
from steady.server.reports.summary import ReportSummary
from steady.server.stats.alert_rules import band_check_values, curve_outliers, final_outliers, guarantee, study_means
from steady.server.stats.changepoint import WANDER_LIMIT, sequential_shift
from steady.server.stats.report import MetricSpec, build_report
from steady.server.stats.resolution import identical_words, no_longer_words
from steady.server.stats.vocabulary import Level
from steady.server.studies.alert_specs import _Rule

log = logging.getLogger("steady.alerts")


def _group_ok(spec: _Rule, group: dict[str, Any], default_levels: tuple[str, ...] | None = None) -> bool:
    levels = [d.value for d in spec.determinism] if spec.determinism else default_levels
    if levels is not None and group.get("determinism") not in levels:
        return False
    if spec.stack is not None:
        stacks = {group.get("stack"), group.get("candidate_stack")} - {None}
        if spec.stack not in stacks:
            return False
    return True


def _summary_of(report: Report) -> dict[str, Any]:
    """Compact verdict numbers kept per study for /metrics (``steady.server.reports.summary.ReportSummary``)."""
    return ReportSummary.of(report).model_dump(mode="json")


def compute_findings(session: Session, study: Study) -> Evaluation:
    """Judge a study against every rule that applies to it (reads only)."""
    rules = repository.rules_for_study(session, study)
    report = reports.study_report(session, study.id)
    summary = _summary_of(report)
    findings: list[Finding] = []
    baseline = session.get(SuiteBaseline, study.suite) if study.suite else None
    for rule in rules:
        spec = rule_spec(rule)
        try:
            findings += _EVALUATORS[rule.kind](session, study, rule, spec, report, baseline)
        except Exception as exc:  # one broken rule must not hide the others
            if unavailable(exc):  # the database, not the rule: the whole evaluation is tried again later
                raise
            log.exception("alert rule %s on study %s", rule.id, study.id)
            findings.append(Finding(rule, getattr(spec, "metric", None), {}, UNKNOWN,
                                    f"rule could not be evaluated: {exc}", {"error": str(exc)}))
    return Evaluation(study, rules, findings, summary, fleet=report.fleet)


def _verdicts(report: Report, level: Level, metric: str) -> list:
    return report.of_level(level, metric)


def _label(group: dict[str, Any]) -> str:
    return "/".join(str(v) for v in group.values())


def _eval_band_width(session, study, rule, spec, report, baseline) -> list[Finding]:
    out = []
    promise = guarantee("band_width", alpha=spec.alpha, stat=spec.stat)
    for v in _verdicts(report, "seed_stability", spec.metric):
        group = v.group.as_dict()
        if not _group_ok(spec, group):
            continue
        spread = v.spread
        n = spread.n
        if v.verdict == "seed_has_no_effect":  # a spread of 0 by construction, not a band within the limit
            out.append(Finding(rule, spec.metric, group, BAD, f"{_label(group)}: {v.summary} ({v.reason})",
                               {"stat": spec.stat, "value": spread.std, "max": spec.max, "n_seeds": n,
                                "verdict": v.verdict, "final_run_ids": v.final_run_ids, "guarantee": promise}))
            continue
        check = None
        if spec.stat == "std":
            value = spread.std
            finite = [x for x in v.final_values if isinstance(x, float) and math.isfinite(x)]
            if value is not None and len(finite) >= 2:  # the report's bound for the same seeds
                check = band_check_values(finite, limit=spec.max, alpha=spec.alpha)
        else:
            ti = spread.tolerance
            value = None if ti is None else ti.high - ti.low
        numbers = {"stat": spec.stat, "value": value, "max": spec.max, "n_seeds": n,
                   **spread.model_dump(mode="json", include={"mean", "std", "tolerance"}), "verdict": v.verdict,
                   "final_run_ids": v.final_run_ids, "guarantee": promise}
        if value is None or (spec.stat == "std" and check is None):
            out.append(Finding(rule, spec.metric, group, UNKNOWN, f"too few seeds for a {spec.stat}", numbers))
            continue
        if check is not None:
            numbers.update(lower_bound=check.lower, alpha=spec.alpha,
                           method="one-sided test of the seed std against max on the report's lower bound "
                                  "(chi-square; from 5 seeds the smaller of it and Bonett's)")
            firing = check.firing
            detail = (f"lower {1 - spec.alpha:.0%} bound {check.lower:.4g} {'>' if firing else '≤'} {spec.max:g}")
        else:
            firing = value > spec.max
            detail = f"{'>' if firing else '≤'} {spec.max:g}"
        what = "std over seeds" if spec.stat == "std" else "tolerance-interval width"
        out.append(Finding(rule, spec.metric, group, firing,
                           f"{what} of final {spec.metric} ({_label(group)}) is {value:.4g}, "
                           f"{detail} over {n} seeds", numbers))
    return out


def _eval_repeatability(session, study, rule, spec, report, baseline) -> list[Finding]:
    out = []
    for v in _verdicts(report, "repeatability", spec.metric):
        group = v.group.as_dict()
        if not _group_ok(spec, group, default_levels=("strict",)):
            continue
        numbers = v.numbers("verdict", "max_abs_delta", "max_rel_delta", "max_ulps", "worst_seed",
                            "first_divergent_step", "source", "data_order_epoch")
        numbers["guarantee"] = guarantee("repeatability_lost")
        if v.verdict == "inconclusive":
            out.append(Finding(rule, spec.metric, group, UNKNOWN, v.reason, numbers))
            continue
        firing = v.verdict != "identical"
        # the words follow what was compared: bits (binary values, digests) or the digits a script printed
        printed = v.compared.resolution if v.compared is not None and v.compared.basis == "printed" else None
        if v.compared is not None:
            numbers["compared"] = v.compared.model_dump(mode="json")
        stops = {s for s in v.last_steps if s is not None}
        digest_only = (bool(v.compared and v.compared.digests) and bool(v.steps_compared) and len(stops) <= 1
                       and v.first_divergent_step is None and not v.max_abs_delta)  # as the plain line tells it
        text = (f"{_label(group)} runs of {spec.metric} are "
                f"{no_longer_words(printed, digest_only=digest_only)}: {v.reason}"
                if firing else f"{_label(group)} runs of {spec.metric} are {identical_words(printed)}")
        out.append(Finding(rule, spec.metric, group, firing, text, numbers))
    return out


def _groups_of(report: Report) -> list[dict[str, Any]]:
    seen = {}
    for v in report.of_level("seed_stability"):
        seen[(v.group.determinism, v.group.stack)] = v.group.as_dict()
    return list(seen.values())


def _eval_diverged(session, study, rule, spec, report, baseline) -> list[Finding]:
    by_group = defaultdict(list)
    for d in report.diverged:
        if d.metric == spec.metric:
            by_group[(d.determinism, d.stack)].append(d.model_dump(mode="json"))
    groups = {(g["determinism"], g["stack"]): g for g in _groups_of(report)}
    for key in by_group:
        groups.setdefault(key, {"determinism": key[0], "stack": key[1]})
    out = []
    for key, group in groups.items():
        if not _group_ok(spec, group):
            continue
        bad = by_group.get(key, [])
        if bad:
            first = min(bad, key=lambda d: d["step"])
            text = (f"{len(bad)} run(s) of {_label(group)} diverged: non-finite {spec.metric}, first at step "
                    f"{first['step']} (run {first['run_id']}, seed {first['seed']})")
        else:
            text = f"no run of {_label(group)} diverged on {spec.metric}"
        out.append(Finding(rule, spec.metric, group, bool(bad), text,
                           {"diverged": bad, "guarantee": guarantee("diverged")}))
    return out


def _eval_cost(session, study, rule, spec, report, baseline) -> list[Finding]:
    out = []
    for cost in report.determinism_cost:
        if cost.numerator != spec.numerator.value:
            continue
        if spec.denominator is not None and cost.denominator != spec.denominator.value:
            continue
        if spec.stack is not None and cost.stack != spec.stack:
            continue
        group = {"stack": cost.stack, "numerator": cost.numerator, "denominator": cost.denominator}
        ratio = cost.ratio
        if math.isnan(ratio):
            continue
        low, high = cost.ci_low, cost.ci_high
        c = cost.model_dump(mode="json")
        details = {**c, "guarantee": guarantee("determinism_cost")}
        if low is None or high is None:
            out.append(Finding(rule, None, group, UNKNOWN,
                               f"step time {c['numerator']}/{c['denominator']} on {c['stack']} is {ratio:.3g}× "
                               "with no interval (fewer than 2 runs of a level)", details))
            continue
        # the same rule as the report's 'fail' against a budget: the whole 95% CI above the limit
        firing = low > spec.max_ratio
        out.append(Finding(rule, None, group, firing,
                           f"step time {c['numerator']}/{c['denominator']} on {c['stack']} is {ratio:.3g}× "
                           f"(95% CI {low:.3g}..{high:.3g}): "
                           + (f"above {spec.max_ratio:g}×" if firing else f"not shown to exceed {spec.max_ratio:g}×"),
                           details))
    return out


def _eval_not_equivalent(session, study, rule, spec, report, baseline) -> list[Finding]:
    out = []
    for v in _verdicts(report, "stack_portability", spec.metric):
        group = v.group.as_dict()
        if not _group_ok(spec, group):
            continue
        numbers = v.numbers("verdict", "margin", "n_reference", "n_candidate", "tost_p_adjusted",
                            "welch_p_adjusted", "band_containment")
        numbers["guarantee"] = guarantee("not_equivalent")
        firing = {"not_equivalent": BAD, "equivalent": OK}.get(v.verdict, UNKNOWN)
        out.append(Finding(rule, spec.metric, {**group, "reference": "study"}, firing,
                           f"stack {v.group.candidate_stack} vs {v.group.reference_stack} "
                           f"({v.group.determinism}): {v.verdict}: {v.reason}", numbers))
    if baseline is None or baseline.study_id == study.id:
        return out
    margin = spec.margin
    if margin is None:
        margin = next((m.margin for m in reports.metric_specs(study) if m.name == spec.metric), None)
    base = baselines.baseline_runs(session, baseline, spec.metric)
    cand = reports.run_data(session, reports.completed_runs(session, study.id), [spec.metric])
    cand = [dataclasses.replace(r, stack=f"candidate:{r.stack}") for r in cand]
    if not base or not cand:
        return out
    cross = build_report([*base, *cand], [MetricSpec(name=spec.metric, margin=margin)], reference_stack="baseline",
                         alpha=spec.alpha, rng=np.random.default_rng([0x57EAD, baseline.study_id, study.id]))
    for v in verdicts_of(typed_verdicts(cross), "stack_portability", spec.metric):
        stack = v.group.candidate_stack.split(":", 1)[1]
        group = {"determinism": v.group.determinism, "reference": "baseline",
                 "reference_stack": baseline.stack, "candidate_stack": stack}
        if not _group_ok(spec, group):
            continue
        firing = {"not_equivalent": BAD, "equivalent": OK}.get(v.verdict, UNKNOWN)
        numbers = v.numbers("verdict", "margin", "n_reference", "n_candidate", "tost_p_adjusted",
                            "welch_p_adjusted", "band_containment")
        numbers["baseline_study_id"] = baseline.study_id
        numbers["guarantee"] = guarantee("not_equivalent")
        out.append(Finding(rule, spec.metric, group, firing,
                           f"stack {stack} ({group['determinism']}) vs the suite baseline (study "
                           f"{baseline.study_id}{', ' + baseline.stack if baseline.stack else ''}): "
                           f"{v.verdict}: {v.reason}", numbers))
    return out


def _eval_out_of_baseline(session, study, rule, spec, report, baseline) -> list[Finding]:
    if baseline is None or baseline.study_id == study.id:
        return []
    base = baselines.baseline_runs(session, baseline, spec.metric)
    cand = reports.run_data(session, reports.completed_runs(session, study.id), [spec.metric])
    by_group = defaultdict(list)
    for r in cand:
        if spec.metric in r.series:
            by_group[(r.determinism, r.stack)].append(r)
    out = []
    for (det, stack), runs in sorted(by_group.items()):
        group = {"determinism": det, "stack": stack}
        if not _group_ok(spec, group):
            continue
        ref = [r for r in base if r.determinism == det and spec.metric in r.series]
        common = {"baseline_study_id": baseline.study_id, "baseline_stack": baseline.stack, "mode": spec.mode}
        if spec.mode == "final":
            fin = final_outliers(ref, runs, spec.metric, alpha=spec.alpha)
            check = fin.check
            if check is None:
                out.append(Finding(rule, spec.metric, group, UNKNOWN,
                                   f"the baseline has {fin.baseline.size} finite {det} run(s) at a step shared with "
                                   "this study; need 2", common))
                continue
            cand_finals = fin.candidates.tolist()
            common["final_step"] = fin.step
            outside = []
            for i in check.outside:
                r, f = runs[i], cand_finals[i]
                outside.append({"run_id": r.run_id, "seed": r.seed, "final": wire.plain(f)})
            numbers = {**common, "interval": [check.low, check.high], "n_baseline": check.n_baseline,
                       "outside": outside, "n_runs": len(runs), "alpha": spec.alpha,
                       "per_run_alpha": check.per_run_alpha,
                       "method": "normal prediction interval, Bonferroni over the candidate runs",
                       "guarantee": guarantee("out_of_baseline", alpha=spec.alpha)}
            text = (f"{len(outside)} of {len(runs)} {_label(group)} run(s) end outside the baseline's "
                    f"prediction interval [{check.low:.4g}, {check.high:.4g}] of {spec.metric} "
                    f"(familywise α={spec.alpha:g})"
                    if outside else f"all {len(runs)} {_label(group)} runs end inside the baseline's prediction "
                    f"interval [{check.low:.4g}, {check.high:.4g}] of {spec.metric}")
            out.append(Finding(rule, spec.metric, group, bool(outside), text, numbers))
        else:
            try:
                check = curve_outliers([r.series[spec.metric] for r in ref], [r.series[spec.metric] for r in runs],
                                       alpha=spec.alpha)
            except ValueError as exc:
                out.append(Finding(rule, spec.metric, group, UNKNOWN,
                                   f"the baseline's {spec.metric} curves cannot judge these runs: {exc}", common))
                continue
            outside = [{"run_id": runs[i].run_id, "seed": runs[i].seed} for i in check.outside]
            numbers = {**common, "interval": [check.low, check.high], "n_baseline": check.n_baseline,
                       "outside": outside, "n_runs": len(runs), "alpha": spec.alpha,
                       "per_run_alpha": check.per_run_alpha,
                       "method": "whole-curve level (steps standardised by the baseline's spread), normal prediction "
                                 "interval, Bonferroni over the candidate runs",
                       "guarantee": guarantee("out_of_baseline", alpha=spec.alpha, mode="curve")}
            text = (f"{len(outside)} of {len(runs)} {_label(group)} run(s) have a {spec.metric} curve outside the "
                    f"baseline's whole-curve prediction interval (familywise α={spec.alpha:g})" if outside else
                    f"all {len(runs)} {_label(group)} runs' {spec.metric} curves stay within the baseline's")
            out.append(Finding(rule, spec.metric, group, bool(outside), text, numbers))
    return out


def _dependence_text(res) -> str:
    """How the history's dependence between consecutive studies was handled, in a few words."""
    if res.dependence == "prewhitened":
        text = (f"prewhitened for AR(1) dependence {res.ar_coefficient:.2f} between consecutive studies "
                f"(estimated from {res.ar_values} studies)")
    elif res.ar_estimate is None:
        text = "history too short to estimate the dependence between consecutive studies: scored as independent"
    else:
        text = f"consecutive studies look independent (AR(1) estimate {res.ar_estimate:.2f})"
    if res.too_dependent:
        text += "; too dependent to judge: the lifetime false-alarm level is not claimed"
    elif res.detected and not res.wander_ruled_out:
        if res.wander_bound is None:
            text += (f"; the history before the alarm ({res.wander_values} studies) is too short to rule out a slowly "
                     "wandering environment, which looks like a shift: the lifetime false-alarm level is not "
                     "guaranteed for this alarm")
        else:
            text += (f"; the history of {res.wander_values} studies cannot rule out a slowly wandering environment, "
                     f"which looks like a shift (correlation over lags 1–{res.wander_lags} up to {res.wander_bound:.2f}, "
                     f"upper 95% bound; the level is claimed below {WANDER_LIMIT:g}): the lifetime false-alarm level is "
                     "not guaranteed for this alarm")
    return text


def _eval_suite_shift(session, study, rule, spec, report, baseline) -> list[Finding]:
    """One history per (stack, determinism level): a change in a study's composition is not a shift."""
    if not study.suite:
        return []
    history = repository.suite_studies(session, study.suite, from_id=baseline.study_id if baseline else None,
                                       upto_id=study.id)
    levels = {d.value for d in spec.determinism} if spec.determinism else None
    stack = spec.stack or (baseline.stack if baseline else None)
    rows = [(study_id, run_stack, det, finals.get(spec.metric))
            for study_id, run_stack, det, finals in repository.final_metrics(session, [s.id for s in history])
            if not (stack is not None and run_stack != stack or levels is not None and det not in levels)]
    out = []
    for (run_stack, det), means in sorted(study_means(rows).items()):
        used = [s for s in history if s.id in means]
        values = np.array([means[s.id] for s in used])
        group = {"suite": study.suite, "stack": run_stack, "determinism": det}
        res = sequential_shift(values, alpha=spec.alpha, horizon=spec.horizon, min_history=spec.min_history,
                               direction=spec.direction)
        numbers = {"history": [{"study_id": s.id, "name": s.name, "mean": float(x)} for s, x in zip(used, values)],
                   "statistic": res.statistic, "threshold": res.threshold, "alpha": res.alpha,
                   "horizon": res.horizon, "arl0": res.arl0, "index": res.index,
                   "alarm_index": res.alarm_index, "cusum_upper": res.upper, "cusum_lower": res.lower,
                   "mean_before": res.mean_before, "mean_after": res.mean_after, "std": res.std,
                   "dependence": res.dependence, "ar_coefficient": res.ar_coefficient,
                   "ar_estimate": res.ar_estimate, "ar_values": res.ar_values, "too_dependent": res.too_dependent,
                   "wander_ruled_out": res.wander_ruled_out, "wander_bound": res.wander_bound,
                   "wander_lags": res.wander_lags, "wander_values": res.wander_values,
                   "method": "self-starting CUSUM (Hawkins 1987) of the studies' AR(1) innovations (estimated "
                             "dependence, bias-corrected, its upper 90% bound) with a lifetime false-alarm "
                             "budget",
                   "guarantee": res.guarantee,
                   "since_baseline_study": baseline.study_id if baseline else None}
        if res.statistic is None:
            # Too short to judge. After a baseline was set the history restarted there: a shift
            # found before it was accepted, so a firing shift alert resolves.
            state = OK if baseline is not None else UNKNOWN
            reason = (f"history restarted at the baseline, study {baseline.study_id}: " if baseline else "") + res.reason
            out.append(Finding(rule, spec.metric, group, state, reason, numbers, suite_level=True))
            continue
        at = used[res.index] if res.index is not None else None  # set when detected, as alarm_index
        alarm_at = used[res.alarm_index].id if res.alarm_index is not None else None
        text = (f"shift in final {spec.metric} of suite {study.suite!r} ({run_stack}/{det}) at study {at.id} "
                f"({at.name}): mean {res.mean_before:.4g} → {res.mean_after:.4g}, CUSUM {res.statistic:.3g} > "
                f"{res.threshold:.3g} at study {alarm_at}, {len(used)} studies"
                if at else f"no shift in final {spec.metric} of suite {study.suite!r} ({run_stack}/{det}) over "
                f"{len(used)} studies (CUSUM {res.statistic:.3g} ≤ {res.threshold:.3g})")
        text += f"; {_dependence_text(res)}"
        out.append(Finding(rule, spec.metric, group, res.detected, text, numbers,
                           study_id=at.id if at else None, suite_level=True))
    return out


_EVALUATORS = {
    "band_width": _eval_band_width,
    "out_of_baseline": _eval_out_of_baseline,
    "repeatability_lost": _eval_repeatability,
    "diverged": _eval_diverged,
    "not_equivalent": _eval_not_equivalent,
    "determinism_cost": _eval_cost,
    "suite_shift": _eval_suite_shift,
}
