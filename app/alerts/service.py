"""Alerting logic: rules, baselines, evaluating a study against its rules, alert state, the outbox.

Evaluation has two halves. ``compute_findings`` only reads: it builds the study report
(``app.reports.service``), compares with the suite's baseline and history, and returns one
``Finding`` per (rule, metric, group) — firing, not firing, or unknown (too little data).
``apply_findings`` writes: it moves each alert (one per dedupe key) between ``firing`` and
``resolved`` and puts one outbox row per webhook on every transition. Managed studies are
evaluated by the dispatcher after ``request_evaluation`` (the ``on_study_finished`` hook);
external studies on ``POST /api/v1/studies/{id}/evaluate``.

Scope of an alert: a study in a suite is judged as "the suite's latest study", so its alerts
are keyed by suite and a later study that passes resolves them; a study without a suite has
its own alerts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import secrets
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.alerts import baselines, egress, repository
from app.alerts.schemas import (
    SEVERITY_ORDER,
    AlertOut,
    AlertRuleOut,
    BaselineIn,
    BaselineOut,
    WebhookIn,
    _Rule,
    rule_adapter,
)
from app.auth.service import Caller, Role, ensure_may_change
from app.errors import Forbidden, Invalid, NotFound
from app.models import Alert, AlertDelivery, AlertRule, Study, StudyEvaluation, SuiteBaseline, Webhook, utcnow
from app.reports import service as reports
from app.reports.models import Report, typed_verdicts, verdicts_of
from app.reports.summary import ReportSummary
from app.stats.align import align_series
from app.stats.alert_rules import band_check, baseline_curve_outliers, baseline_outliers, guarantee
from app.stats.changepoint import sequential_shift
from app.stats.report import MetricSpec, build_report, common_finals
from app.stats.vocabulary import Level
from app.studies import service as studies
from app import wire

log = logging.getLogger("steady.alerts")

OK, BAD, UNKNOWN = False, True, None

# --- rules -----------------------------------------------------------------------------------


def rule_spec(rule: AlertRule) -> _Rule:
    body = {"kind": rule.kind, "name": rule.name, "severity": rule.severity, **rule.params}
    if rule.metric is not None:
        body["metric"] = rule.metric
    return rule_adapter.validate_python(body)


def rule_out(rule: AlertRule) -> AlertRuleOut:
    return AlertRuleOut.model_validate(rule, from_attributes=True)


def _store_rule(session: Session, spec: _Rule, *, study_id: int | None, suite: str | None, source: str,
                owner_token_id: int | None) -> AlertRule:
    existing = repository.find_rule(session, study_id=study_id, suite=suite, name=spec.rule_name)
    fields = dict(kind=spec.kind, metric=getattr(spec, "metric", None), severity=spec.severity,  # type: ignore[attr-defined]
                  params=spec.params(), source=source)
    if existing is not None:
        for k, v in fields.items():
            setattr(existing, k, v)
        session.flush()
        return existing
    rule = AlertRule(name=spec.rule_name, study_id=study_id, suite=suite, owner_token_id=owner_token_id, **fields)
    session.add(rule)
    session.flush()
    return rule


def create_rule(session: Session, spec: _Rule, caller: Caller) -> AlertRule:
    """Create a rule; the caller owns it. A study's rule needs the study's owner, a suite's rule the
    suite's owner, and a global rule (it watches every user's studies) an admin."""
    if spec.study_id is not None and spec.suite is not None:
        raise Invalid(("body", "suite"), "give either study_id or suite (or neither, for a global rule), not both")
    if spec.study_id is not None:
        study = session.get(Study, spec.study_id)
        if study is None:
            raise Invalid(("body", "study_id"), f"study {spec.study_id} does not exist")
        studies.ensure_study_owner(study, caller)
        _check_metric(study, spec, ("body", "metric"))
    elif spec.suite is not None:
        studies.ensure_suite_owner(session, spec.suite, caller)
    if spec.kind == "suite_shift" and spec.suite is None:  # type: ignore[attr-defined]
        study = session.get(Study, spec.study_id) if spec.study_id is not None else None
        if study is None or not study.suite:
            raise Invalid(("body", "suite"), "a suite_shift rule watches a suite: give 'suite'")
    if spec.study_id is None and spec.suite is None and caller.role != Role.admin:
        raise Forbidden("a global rule (neither study_id nor suite) watches every user's studies: it needs an admin token")
    if repository.find_rule(session, study_id=spec.study_id, suite=spec.suite, name=spec.rule_name) is not None:
        raise Invalid(("body", "name"), f"a rule named {spec.rule_name!r} already exists in this scope")
    return _store_rule(session, spec, study_id=spec.study_id, suite=spec.suite, source="api",
                       owner_token_id=caller.token_id)


def _check_metric(study: Study, spec: _Rule, loc: tuple) -> None:
    metric = getattr(spec, "metric", None)
    names = [m["name"] for m in study.spec.get("metrics", [])]
    if metric is not None and metric not in names:
        raise Invalid(loc, f"metric {metric!r} is not one of the study's metrics {names}")


def rules_from_spec(session: Session, study: Study) -> list[AlertRule]:
    """Store the ``alerts`` of a study spec: scoped to the study's suite when it has one, else to the study.

    A rule with the same name in the same scope is updated, so re-submitting a suite's spec
    keeps one rule (and one alert per key) instead of piling up copies.
    """
    out = []
    for i, raw in enumerate(study.spec.get("alerts") or []):
        spec = rule_adapter.validate_python(raw)
        _check_metric(study, spec, ("body", "alerts", i, "metric"))
        if study.suite:
            out.append(_store_rule(session, spec, study_id=None, suite=study.suite, source="spec",
                                   owner_token_id=study.owner_token_id))
        else:
            out.append(_store_rule(session, spec, study_id=study.id, suite=None, source="spec",
                                   owner_token_id=study.owner_token_id))
    return out


def delete_rule(session: Session, rule_id: int, caller: Caller) -> None:
    rule = session.get(AlertRule, rule_id)
    if rule is None:
        raise NotFound(f"alert rule {rule_id} not found")
    ensure_may_change(caller, rule.owner_token_id, f"alert rule {rule_id}")
    session.delete(rule)
    session.flush()


# --- baselines -------------------------------------------------------------------------------


def set_baseline(session: Session, suite: str, body: BaselineIn, caller: Caller) -> SuiteBaseline:
    study = session.get(Study, body.study_id)
    if study is None:
        raise Invalid(("body", "study_id"), f"study {body.study_id} does not exist")
    studies.ensure_suite_owner(session, suite, caller)
    if study.suite != suite:
        raise Invalid(("body", "study_id"), f"study {study.id} is in suite {study.suite!r}, not {suite!r}")
    if body.stack is not None:
        stacks = repository.study_stacks(session, study.id)
        if body.stack not in stacks:
            raise Invalid(("body", "stack"), f"study {study.id} has no runs on stack {body.stack!r}; it has {sorted(stacks)}")
    row = session.get(SuiteBaseline, suite)
    if row is not None:
        ensure_may_change(caller, row.owner_token_id, f"the baseline of suite {suite!r}")
    # every set is a new frozen version: comparisons read it, never the live rows
    snap = baselines.record_snapshot(session, suite, study, body.stack, caller, body.reason)
    if row is None:
        row = SuiteBaseline(suite=suite, study_id=study.id, stack=body.stack, owner_token_id=caller.token_id,
                            snapshot_id=snap.id)
        session.add(row)
    else:
        row.study_id, row.stack, row.set_at, row.snapshot_id = study.id, body.stack, utcnow(), snap.id
    session.flush()
    return row


def baseline_out(session: Session, row: SuiteBaseline) -> BaselineOut:
    out = BaselineOut.model_validate(row, from_attributes=True)
    snap = baselines.snapshot_of(session, row)
    if snap is not None:
        out = out.model_copy(update={"version": snap.version, "digest": snap.digest, "n_runs": snap.n_runs,
                                     "set_by": snap.created_by, "reason": snap.reason})
    return out


def delete_baseline(session: Session, suite: str, caller: Caller) -> None:
    row = get_baseline(session, suite)
    ensure_may_change(caller, row.owner_token_id, f"the baseline of suite {suite!r}")
    session.delete(row)
    session.flush()


def ack_alert(session: Session, alert: Alert, caller: Caller) -> Alert:
    """Acknowledge: the owner of the alert's rule or of its study (or an admin)."""
    rule = session.get(AlertRule, alert.rule_id)
    study = session.get(Study, alert.study_id) if alert.study_id is not None else None
    owners = {rule.owner_token_id if rule else None, study.owner_token_id if study else None} - {None}
    if caller.role != Role.admin and caller.token_id not in owners:
        raise Forbidden(f"alert {alert.id} is on another user's rule and study: only they or an admin may acknowledge it")
    alert.acked_at, alert.acked_by = utcnow(), caller.name
    session.flush()
    return alert


def get_baseline(session: Session, suite: str) -> SuiteBaseline:
    row = session.get(SuiteBaseline, suite)
    if row is None:
        raise NotFound(f"suite {suite!r} has no baseline")
    return row


# --- webhooks --------------------------------------------------------------------------------


def check_webhook_url(url: str, *, allow_private: bool) -> None:
    """Refuse non-HTTP(S) URLs and, unless allowed, hosts resolving to non-public addresses
    (``app.alerts.egress``, the one guard; the dispatcher checks again at every attempt)."""
    try:
        egress.resolve(url, allow_private=allow_private)
    except egress.RefusedTarget as exc:
        raise Invalid(("body", "url"), str(exc)) from None


def create_webhook(session: Session, body: WebhookIn, *, allow_private: bool) -> tuple[Webhook, str]:
    check_webhook_url(body.url, allow_private=allow_private)
    secret = body.secret or "whsec_" + secrets.token_urlsafe(32)
    hook = Webhook(name=body.name, url=body.url, secret=secret, events=list(dict.fromkeys(body.events)),
                   min_severity=body.min_severity)
    session.add(hook)
    session.flush()
    return hook, secret


def delete_webhook(session: Session, webhook_id: int) -> None:
    hook = session.get(Webhook, webhook_id)
    if hook is None:
        raise NotFound(f"webhook {webhook_id} not found")
    session.delete(hook)
    session.flush()


def sign(secret: str, body: bytes) -> str:
    import hmac

    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


# --- evaluation: findings --------------------------------------------------------------------


@dataclass
class Finding:
    rule: AlertRule
    metric: str | None
    group: dict[str, Any]
    firing: bool | None  # None: not enough data to say; the alert is left as it is
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    study_id: int | None = None  # the study the alert points at (default: the evaluated one)
    suite_level: bool = False  # a suite-wide finding (shift): keyed by suite even for its rules


@dataclass
class Evaluation:
    study: Study
    rules: list[AlertRule]
    findings: list[Finding]
    summary: dict[str, Any]




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
    """Compact verdict numbers kept per study for /metrics (``app.reports.summary.ReportSummary``)."""
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
            log.exception("alert rule %s on study %s", rule.id, study.id)
            findings.append(Finding(rule, getattr(spec, "metric", None), {}, UNKNOWN,
                                    f"rule could not be evaluated: {exc}", {"error": str(exc)}))
    return Evaluation(study, rules, findings, summary)


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
        check = None
        if spec.stat == "std":
            value = spread.std
            if value is not None and n >= 2:
                check = band_check(value, int(n), limit=spec.max, alpha=spec.alpha)
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
                           method="one-sided chi-square test of the seed std against max")
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
        text = (f"{_label(group)} runs of {spec.metric} are no longer bitwise identical: {v.reason}"
                if firing else f"{_label(group)} runs of {spec.metric} are bitwise identical")
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


def _baseline_runs(session: Session, baseline: SuiteBaseline, metric: str):
    return baselines.baseline_runs(session, baseline, metric)


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
    base = _baseline_runs(session, baseline, spec.metric)
    cand = reports.run_data(session, reports.completed_runs(session, study.id), [spec.metric])
    cand = [_relabel(r, f"candidate:{r.stack}") for r in cand]
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


def _relabel(r, stack: str):
    import dataclasses

    return dataclasses.replace(r, stack=stack)


def _eval_out_of_baseline(session, study, rule, spec, report, baseline) -> list[Finding]:
    if baseline is None or baseline.study_id == study.id:
        return []
    base = _baseline_runs(session, baseline, spec.metric)
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
            # every run read at the last step all non-diverged runs (baseline and candidates) logged:
            # a run's own last step made a run that stopped early look off
            fin = common_finals(ref + runs, spec.metric)
            at = dict(zip(fin.run_ids, fin.values.tolist()))
            finals = [at[r.run_id] for r in ref if r.run_id in at]
            if len(finals) < 2:
                out.append(Finding(rule, spec.metric, group, UNKNOWN,
                                   f"the baseline has {len(finals)} finite {det} run(s) at a step shared with this "
                                   "study; need 2", common))
                continue
            cand_finals = [at.get(r.run_id, float("nan")) for r in runs]
            check = baseline_outliers(np.array(finals), np.array(cand_finals), alpha=spec.alpha)
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
            check = _curve_check(ref, runs, spec)
            if isinstance(check, str):
                out.append(Finding(rule, spec.metric, group, UNKNOWN, check, common))
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


def _curve_check(ref, runs, spec):
    """``baseline_curve_outliers`` of the candidate runs against the baseline runs on their common
    step grid, or the reason it cannot be judged."""
    aligned = align_series({("b", i): r.series[spec.metric] for i, r in enumerate(ref)}
                           | {("c", i): r.series[spec.metric] for i, r in enumerate(runs)})
    n = len(ref)
    try:
        return baseline_curve_outliers(aligned.values[:n], aligned.values[n:], alpha=spec.alpha)
    except ValueError as exc:
        return f"the baseline's {spec.metric} curves cannot judge these runs: {exc}"


def _eval_suite_shift(session, study, rule, spec, report, baseline) -> list[Finding]:
    """One history per (stack, determinism level): a change in a study's composition is not a shift."""
    if not study.suite:
        return []
    history = repository.suite_studies(session, study.suite, from_id=baseline.study_id if baseline else None,
                                       upto_id=study.id)
    levels = {d.value for d in spec.determinism} if spec.determinism else None
    stack = spec.stack or (baseline.stack if baseline else None)
    sums: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for study_id, run_stack, det, finals in repository.final_metrics(session, [s.id for s in history]):
        if stack is not None and run_stack != stack or levels is not None and det not in levels:
            continue
        v = finals.get(spec.metric)
        if isinstance(v, (int, float)) and np.isfinite(v):
            sums[(run_stack, det)][study_id].append(float(v))
    out = []
    for (run_stack, det), per_study in sorted(sums.items()):
        used = [s for s in history if per_study.get(s.id)]
        values = np.array([np.mean(per_study[s.id]) for s in used])
        group = {"suite": study.suite, "stack": run_stack, "determinism": det}
        res = sequential_shift(values, alpha=spec.alpha, horizon=spec.horizon, min_history=spec.min_history,
                               direction=spec.direction)
        numbers = {"history": [{"study_id": s.id, "name": s.name, "mean": float(x)} for s, x in zip(used, values)],
                   "statistic": res.statistic, "threshold": res.threshold, "alpha": res.alpha,
                   "horizon": res.horizon, "arl0": res.arl0, "index": res.index,
                   "alarm_index": res.alarm_index, "cusum_upper": res.upper, "cusum_lower": res.lower,
                   "mean_before": res.mean_before, "mean_after": res.mean_after, "std": res.std,
                   "method": "self-starting CUSUM (Hawkins 1987) with a lifetime false-alarm budget",
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

# --- evaluation: alert state -----------------------------------------------------------------


def dedupe_key(rule_id: int, scope: str, metric: str | None, group: dict[str, Any]) -> str:
    canonical = json.dumps([rule_id, scope, metric, group], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _scope(study: Study) -> str:
    return f"suite:{study.suite}" if study.suite else f"study:{study.id}"


def alert_out(alert: Alert) -> AlertOut:
    return AlertOut.model_validate(alert, from_attributes=True)


def apply_findings(session: Session, ev: Evaluation, *, base_url: str) -> tuple[list[Alert], list[Alert]]:
    """Move alerts between firing and resolved; one outbox row per webhook on each transition.

    A suite-scoped alert last judged on a newer study of the suite is left alone: an old
    study re-evaluated must not overturn the verdict on the newest one.
    """
    study, now = ev.study, utcnow()
    fired, resolved = [], []
    seen: dict[int, set[str]] = defaultdict(set)
    for f in ev.findings:
        key = dedupe_key(f.rule.id, _scope(study), f.metric, f.group)
        seen[f.rule.id].add(key)
        alert = repository.alert_by_key(session, key)
        if alert is not None and (alert.details or {}).get("evaluated_study_id", 0) > study.id:
            continue
        if f.firing is None:
            continue
        target = f.study_id or study.id
        details = {**f.details, "evaluated_study_id": study.id}
        if f.firing:
            if alert is None:
                alert = _insert_alert(session, key, f, study, target, details, base_url)
                if alert is None:
                    continue
                fired.append(alert)
            else:
                was_firing = alert.state == "firing"
                _update(alert, f, target, details, base_url, now)
                if not was_firing:
                    alert.state, alert.resolved_at = "firing", None
                    alert.fire_count += 1
                    alert.first_fired_at = alert.first_fired_at or now
                    alert.acked_at = alert.acked_by = None
                    fired.append(alert)
                alert.last_fired_at = now
        elif alert is not None and alert.state == "firing":
            _update(alert, f, target, details, base_url, now)
            alert.state, alert.resolved_at = "resolved", now
            resolved.append(alert)
        elif alert is not None:
            alert.evaluated_at = now
    # Firing alerts of an evaluated rule in this scope that no finding mentions any more
    # (a stack dropped from the suite, say) are resolved too, unless some data was missing.
    unknown = {f.rule.id for f in ev.findings if f.firing is None}
    for rule in ev.rules:
        if rule.id in unknown:
            continue
        for alert in repository.firing_alerts_of_rule(session, rule.id, suite=study.suite,
                                                      study_id=None if study.suite else study.id):
            if alert.dedupe_key in seen[rule.id] or (alert.details or {}).get("evaluated_study_id", 0) > study.id:
                continue
            alert.state, alert.resolved_at, alert.evaluated_at = "resolved", now, now
            alert.summary = f"no longer observed: {alert.summary}"
            resolved.append(alert)
    session.flush()
    for alert in fired:
        enqueue(session, alert, "firing")
    for alert in resolved:
        enqueue(session, alert, "resolved")
    session.flush()
    return fired, resolved


def _link(base_url: str, study_id: int) -> str:
    return f"{base_url.rstrip('/')}/studies/{study_id}"


def _update(alert: Alert, f: Finding, target: int, details: dict, base_url: str, now) -> None:
    alert.summary, alert.details, alert.study_id = f.summary, details, target
    alert.link, alert.evaluated_at, alert.severity = _link(base_url, target), now, f.rule.severity


def _insert_alert(session, key, f: Finding, study: Study, target: int, details, base_url) -> Alert | None:
    alert = Alert(dedupe_key=key, rule_id=f.rule.id, kind=f.rule.kind, severity=f.rule.severity, state="firing",
                  study_id=target, suite=study.suite, metric=f.metric, group=f.group, summary=f.summary,
                  details=details, link=_link(base_url, target), fire_count=1)
    try:
        with session.begin_nested():
            session.add(alert)
            session.flush()
    except IntegrityError:  # another process created it between our read and insert
        return None
    return alert


def slack_escape(text: str) -> str:
    """Escape Slack's control characters, so names and summaries cannot write ``<!channel>``,
    ``<@user>`` or ``<https://evil|a link>``: Slack reads ``&amp; &lt; &gt;`` back as text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def payload(alert: Alert, event: str) -> str:
    """The delivery body. ``text`` is Slack-compatible (escaped); ``alert`` has the raw fields."""
    tag = "FIRING" if event == "firing" else "RESOLVED"
    where = f"suite {alert.suite!r}, " if alert.suite else ""
    text = slack_escape(f"[{tag}] {alert.severity}: {alert.summary} ({where}study {alert.study_id}) {alert.link}")
    body = {"text": text, "event": event, "alert": alert_out(alert).model_dump(mode="json")}
    return wire.dumps(body, sort_keys=True, separators=(",", ":"), default=str)


def enqueue(session: Session, alert: Alert, event: str) -> int:
    """One outbox row per interested webhook for this transition (idempotent per transition)."""
    transition = alert.fire_count * 2 + (1 if event == "resolved" else 0)
    n = 0
    body = None
    for hook in repository.webhooks(session):
        if event not in hook.events or SEVERITY_ORDER[alert.severity] < SEVERITY_ORDER.get(hook.min_severity, 0):
            continue
        body = body or payload(alert, event)
        try:
            with session.begin_nested():
                session.add(AlertDelivery(webhook_id=hook.id, alert_id=alert.id, event=event, transition=transition,
                                          body=body, status="pending", attempts=0, next_attempt_at=utcnow()))
                session.flush()
            n += 1
        except IntegrityError:
            pass
    return n


# --- evaluation: entry points ----------------------------------------------------------------


def request_evaluation(session: Session, study: Study) -> None:
    """Ask the dispatcher to evaluate the study (the ``on_study_finished`` hook)."""
    row = session.get(StudyEvaluation, study.id)
    if row is None:
        session.add(StudyEvaluation(study_id=study.id, state="pending", requested_at=utcnow(), summary={}))
    else:
        row.state, row.requested_at, row.error = "pending", utcnow(), None
    session.flush()


def _record(session: Session, study_id: int, summary: dict[str, Any]) -> None:
    row = session.get(StudyEvaluation, study_id)
    if row is None:
        row = StudyEvaluation(study_id=study_id, requested_at=utcnow())
        session.add(row)
    row.state, row.evaluated_at, row.summary, row.error = "done", utcnow(), summary, None
    session.flush()


def evaluate_study(session: Session, study_id: int, *, base_url: str) -> tuple[Evaluation, list[Alert], list[Alert]]:
    """Evaluate now, in the caller's transaction (``POST /api/v1/studies/{id}/evaluate``)."""
    study = studies.get_study(session, study_id)
    if study.kind == "managed" and study.status not in ("completed", "failed"):
        from app.errors import Conflict

        raise Conflict(f"study {study_id} is {study.status}: it is evaluated when its last run ends")
    rules_from_spec(session, study)
    ev = compute_findings(session, study)
    fired, resolved = apply_findings(session, ev, base_url=base_url)
    _record(session, study.id, ev.summary)
    return ev, fired, resolved


def run_pending_evaluations(database, *, base_url: str, limit: int = 10) -> int:
    """Evaluate requested studies: compute in a read session, then claim and apply in one write.

    Two processes may compute the same evaluation; the conditional claim lets one apply it.
    """
    done = 0
    with database.read() as session:
        pending = repository.pending_evaluations(session, limit)
    for study_id, requested_at in pending:
        try:
            with database.read() as session:
                study = session.get(Study, study_id)
                ev = compute_findings(session, study) if study is not None else None
                # a read session expires its objects when it closes: keep the ids
                rule_ids = [r.id for r in ev.rules] if ev else []
                finding_rules = [f.rule.id for f in ev.findings] if ev else []
            with database.write() as session:
                if not repository.claim_evaluation(session, study_id, requested_at, state="done",
                                                   evaluated_at=utcnow(), summary=ev.summary if ev else {}):
                    continue
                if ev is not None:
                    rules = {rid: session.get(AlertRule, rid) for rid in rule_ids}
                    for f, rid in zip(ev.findings, finding_rules):
                        f.rule = rules[rid]
                    ev.study = session.get(Study, study_id)
                    ev.rules = [r for r in rules.values() if r is not None]
                    ev.findings = [f for f in ev.findings if f.rule is not None]
                    if ev.study is not None:
                        apply_findings(session, ev, base_url=base_url)
                done += 1
        except Exception as exc:
            log.exception("evaluating study %s", study_id)
            with database.write() as session:
                repository.claim_evaluation(session, study_id, requested_at, state="error", error=str(exc)[:2000],
                                            evaluated_at=utcnow())
    return done


def study_finished(session: Session, study: Study) -> None:
    """The ``on_study_finished`` hook: store the spec's rules, and request an evaluation."""
    rules_from_spec(session, study)
    request_evaluation(session, study)
