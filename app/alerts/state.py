"""The alert state machine: each alert (one per dedupe key) moves between ``firing`` and
``resolved`` as findings come in; every transition puts its deliveries in the outbox.

Scope of an alert: a study in a suite is judged as "the suite's latest study", so its alerts
are keyed by suite and a later study that passes resolves them; a study without a suite has
its own alerts.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from steady.server.alerts import repository
from steady.server.alerts.findings import Evaluation, Finding
from steady.server.alerts.outbox import enqueue
from steady.server.kit.auth import Caller, Role
from steady.server.kit.errors import Forbidden
from steady.server.models import Alert, AlertRule, Study, utcnow


def dedupe_key(rule_id: int, scope: str, metric: str | None, group: dict[str, Any]) -> str:
    canonical = json.dumps([rule_id, scope, metric, group], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _scope(study: Study) -> str:
    return f"suite:{study.suite}" if study.suite else f"study:{study.id}"


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
