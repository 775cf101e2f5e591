"""Alert rules: created over the API (owned by the caller) or stored from a study spec's ``alerts``."""

from __future__ import annotations

from sqlalchemy.orm import Session

from steady.server.alerts import repository
from steady.server.alerts.schemas import AlertRuleOut
from steady.server.kit.auth import Caller, Role, ensure_may_change
from steady.server.kit.errors import Forbidden, Invalid, NotFound
from steady.server.models import AlertRule, Study
from steady.server.studies import service as studies
from steady.server.studies.alert_specs import _Rule, rule_adapter


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
