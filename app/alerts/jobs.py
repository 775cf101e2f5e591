"""Evaluation jobs: a study asks to be judged against its alert rules, and is.

Evaluation has two halves. ``evaluators.compute_findings`` only reads: it builds the study's
report, compares with the suite's baseline and history, and returns the findings.
``state.apply_findings`` writes: it moves the alerts and fills the outbox. A managed study that
finishes records a pending evaluation (``steady.server.studies``, the ``study_evaluations`` row); the
dispatcher runs ``run_pending_evaluations`` every tick. External studies are evaluated on
``POST /api/v1/studies/{id}/evaluate`` (``evaluate_study``).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from steady.server.alerts import quarantine, repository
from steady.server.alerts.evaluators import compute_findings
from steady.server.alerts.findings import Evaluation
from steady.server.alerts.rules import rules_from_spec
from steady.server.alerts.state import apply_findings
from steady.server.kit.db import Database, unavailable
from steady.server.kit.errors import Conflict
from steady.server.models import Alert, AlertRule, Study, StudyEvaluation, utcnow
from steady.server.studies import service as studies

log = logging.getLogger("steady.alerts")


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
        raise Conflict(f"study {study_id} is {study.status}: it is evaluated when its last run ends")
    rules_from_spec(session, study)
    ev = compute_findings(session, study)
    fired, resolved = apply_findings(session, ev, base_url=base_url)
    _fleet_results(session, study, ev, base_url=base_url)
    _record(session, study.id, ev.summary)
    return ev, fired, resolved


def _fleet_results(session: Session, study: Study, ev: Evaluation, *, base_url: str) -> None:
    """A finished fleet check: each checked worker's result goes into its history, and the workers it named
    are quarantined when its spec asks (``fleet.quarantine``; ``steady.server.alerts.quarantine``)."""
    if ev.fleet is not None and study.spec.get("fleet"):
        quarantine.apply_fleet_result(session, study, quarantine.fleet_checks(study.spec, ev.fleet), base_url=base_url)


def _store_spec_rules(database: Database, study_id: int, requested_at: datetime) -> None:
    """Store the ``alerts`` of a finished study's spec before it is judged. The pending row is
    locked while they are stored, so two processes do not both add the same rule."""
    with database.write() as session:
        if not repository.lock_pending_evaluation(session, study_id, requested_at):
            return  # judged or re-requested meanwhile
        study = session.get(Study, study_id)
        if study is not None:
            rules_from_spec(session, study)


def run_pending_evaluations(database: Database, *, base_url: str, limit: int = 10) -> int:
    """Evaluate requested studies: store their spec's rules, compute in a read session, then
    claim and apply in one write.

    Two processes may compute the same evaluation; the conditional claim lets one apply it.
    """
    done = 0
    with database.read() as session:
        pending = repository.pending_evaluations(session, limit)
    for study_id, requested_at in pending:
        try:
            _store_spec_rules(database, study_id, requested_at)
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
                    kept = []
                    for f, rid in zip(ev.findings, finding_rules):
                        rule = rules[rid]
                        if rule is not None:  # a rule deleted meanwhile: its findings go
                            f.rule = rule
                            kept.append(f)
                    ev.rules = [r for r in rules.values() if r is not None]
                    ev.findings = kept
                    study = session.get(Study, study_id)
                    if study is not None:
                        ev.study = study
                        apply_findings(session, ev, base_url=base_url)
                        _fleet_results(session, study, ev, base_url=base_url)
                done += 1
        except Exception as exc:
            if unavailable(exc):  # not the study's fault: it stays pending, and the loop backs off
                raise
            log.exception("evaluating study %s", study_id)
            with database.write() as session:
                repository.claim_evaluation(session, study_id, requested_at, state="error", error=str(exc)[:2000],
                                            evaluated_at=utcnow())
    return done
