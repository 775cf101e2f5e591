"""Quarantine: a worker state in the database that the lease query honours.

A quarantined worker leases no run of a study that respects quarantine (``respects``); a fleet check
that names the worker sets it (``apply_fleet_result``), an admin sets or lifts it (``quarantine``,
``release``). Every change is a ``WorkerEvent`` (who, when, why) and moves the worker's alert — firing
when quarantined, resolved when lifted — through the outbox to every webhook (JSON and Slack text);
``GET /metrics`` counts quarantined workers (``steady_workers_quarantined``).

A fleet check's result for each worker it checked is a ``check`` event too: the worker's history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from steady.server.alerts.outbox import enqueue
from steady.server.alerts.state import dedupe_key
from steady.server.kit.errors import Conflict
from steady.server.kit.repository import paginate
from steady.server.models import Alert, AlertRule, Study, Worker, WorkerEvent, utcnow

RULE_NAME = "worker quarantine"
RULE_KIND = "worker_quarantine"
RULE_SOURCE = "system"  # not a rule a study is judged against (repository.rules_for_study skips it)

QUARANTINED, RELEASED, CHECK = "quarantined", "released", "check"
# A worker's verdict in a fleet check: its runs equal its group's majority (agrees), part from it (faulty), are
# markedly slower than its group's others (slow); or the check could not judge it (no_runs, no_majority).
AGREES, FAULTY, SLOW, NO_RUNS, NO_MAJORITY = "agrees", "faulty", "slow", "no_runs", "no_majority"
# the verdicts that name a worker, and quarantine it when the fleet spec asks (``fleet.quarantine: true``)
FAULTY_VERDICTS = frozenset({FAULTY, SLOW})


def respects(spec: Mapping[str, Any]) -> bool:
    """Whether a study's runs are kept from quarantined workers: the spec's ``respect_quarantine``; unset,
    yes, except for a fleet check (a ``fleet`` section), which re-tests quarantined workers by default so
    that a scheduled check shows whether the fault is still there."""
    value = spec.get("respect_quarantine")
    if value is None:  # as the lease query says it (runs.repository.pick_queued): a fleet section is present
        return spec.get("fleet") is None
    return bool(value)


def is_quarantined(worker: Worker) -> bool:
    return worker.quarantined_at is not None


def quarantined_count(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(Worker).where(Worker.quarantined_at.is_not(None)))
               or 0)


def _locked(session: Session, worker: Worker) -> Worker:
    """The worker's row, re-read under a lock (as the lease query takes it): one quarantine change at a time,
    so an admin and a fleet check quarantining together record one change and fire one alert."""
    return session.scalars(select(Worker).where(Worker.id == worker.id).with_for_update()
                           .execution_options(populate_existing=True)).one()


def quarantine(session: Session, worker: Worker, *, reason: str, actor: str, base_url: str,
               study_id: int | None = None) -> bool:
    """Quarantine ``worker``; False (nothing recorded) when it is quarantined already."""
    worker = _locked(session, worker)
    if is_quarantined(worker):
        return False
    now = utcnow()
    worker.quarantined_at, worker.quarantined_by, worker.quarantine_reason = now, actor, reason
    worker.quarantine_study_id = study_id
    session.add(WorkerEvent(worker_id=worker.id, kind=QUARANTINED, at=now, actor=actor, reason=reason,
                            study_id=study_id, details={}))
    session.flush()
    _alert(session, worker, firing=True, base_url=base_url,
           summary=f"worker {worker.name} quarantined by {actor}: {reason}; it leases no run of a study that "
           "respects quarantine until an admin releases it")
    return True


def release(session: Session, worker: Worker, *, actor: str, base_url: str, reason: str | None = None) -> None:
    """Lift the worker's quarantine (409 when it is not quarantined)."""
    worker = _locked(session, worker)
    if not is_quarantined(worker):
        raise Conflict(f"worker {worker.name} (id {worker.id}) is not quarantined", loc=("path", "worker_id"))
    now = utcnow()
    since = worker.quarantined_at
    worker.quarantined_at = worker.quarantined_by = worker.quarantine_reason = worker.quarantine_study_id = None
    worker.quarantine_lifted_at, worker.quarantine_lifted_by = now, actor
    session.add(WorkerEvent(worker_id=worker.id, kind=RELEASED, at=now, actor=actor, reason=reason, details={}))
    session.flush()
    why = f": {reason}" if reason else ""
    _alert(session, worker, firing=False, base_url=base_url,
           summary=f"worker {worker.name} released from quarantine by {actor}{why} "
           f"(quarantined since {since:%Y-%m-%d %H:%M} UTC); it leases runs again")


@dataclass(frozen=True)
class WorkerCheck:
    """One worker's result in a fleet check, as the fleet report states it.

    ``verdict``: one of ``AGREES``, ``FAULTY``, ``SLOW``, ``NO_RUNS``, ``NO_MAJORITY``; ``first_divergent_step``
    is the first step where its runs part from the majority (None when they do not, or only a digest does).
    ``details`` is kept as given (repeats that part, intermittent or consistent, the step-time ratio).
    ``reason`` is what a quarantine it causes says (default: its runs part from its peers' from that step).
    """

    worker_id: int
    verdict: str
    first_divergent_step: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None

    @property
    def faulty(self) -> bool:
        return self.verdict in FAULTY_VERDICTS


def apply_fleet_result(session: Session, study: Study, checks: Iterable[WorkerCheck], *, base_url: str,
                       quarantine_faulty: bool | None = None) -> list[int]:
    """Record a fleet check's result in each checked worker's history and, when asked (``quarantine_faulty``,
    by default the fleet spec's ``quarantine``), quarantine every worker the check named. Returns the ids of
    the workers it quarantined now. Calling it again for the same study records nothing twice."""
    if quarantine_faulty is None:
        quarantine_faulty = bool((study.spec.get("fleet") or {}).get("quarantine"))
    recorded = set(session.scalars(select(WorkerEvent.worker_id).where(
        WorkerEvent.study_id == study.id, WorkerEvent.kind == CHECK)))
    quarantined: list[int] = []
    for check in checks:
        worker = session.get(Worker, check.worker_id)
        if worker is None or check.worker_id in recorded:
            continue
        session.add(WorkerEvent(worker_id=worker.id, kind=CHECK, study_id=study.id, verdict=check.verdict,
                                first_divergent_step=check.first_divergent_step, details=dict(check.details),
                                actor=f"study {study.id}"))
        session.flush()
        if quarantine_faulty and check.faulty:
            where = "" if check.first_divergent_step is None else f" from step {check.first_divergent_step}"
            what = check.reason or "its runs part from its peers'" + where
            reason = f"{what} in fleet check {study.name!r}"
            if quarantine(session, worker, reason=reason, actor=f"fleet check (study {study.id})",
                          base_url=base_url, study_id=study.id):
                quarantined.append(worker.id)
    return quarantined


def fleet_checks(spec: Mapping[str, Any], fleet: Any) -> list[WorkerCheck]:
    """Each pool worker's result, read from a report's fleet section (``reports.fleet.FleetReport``) and the
    pool the spec resolved (``fleet.pool``: id and name)."""
    ids = {str(w["name"]): int(w["id"]) for w in (spec.get("fleet") or {}).get("pool") or []}
    named = {f.worker: f for g in fleet.groups for f in g.findings}
    slow = {s.worker: s for s in fleet.slow}
    group_of = {w: g for g in fleet.groups for w in g.workers}
    missing = {m.worker: m for m in fleet.missing}
    out = []
    for name, wid in ids.items():
        if name in named:
            f = named[name]
            what = f"{f.parted} of its {f.runs} runs part from its peers'" + (
                f" from step {f.first_step}" if f.first_step is not None else
                f" in their {', '.join(d.replace('_', ' ') for d in f.digests)} digest" if f.digests else "")
            out.append(WorkerCheck(wid, FAULTY, f.first_step, reason=what, details=dict(
                runs=f.runs, parted=f.parted, kind=f.kind, metric=f.metric, digests=list(f.digests),
                run_ids=list(f.run_ids), group=f.group)))
        elif name in slow:
            s = slow[name]
            out.append(WorkerCheck(wid, SLOW, reason=f"its median step time is {s.ratio:.3g}× its peers'",
                                   details=dict(ratio=s.ratio, median_s=s.median_s, others_median_s=s.others_median_s,
                                                p_value=s.p_value, group=s.group)))
        elif name not in group_of:
            m = missing.get(name)
            out.append(WorkerCheck(wid, NO_RUNS, details={"reason": m.reason if m else None}))
        elif not group_of[name].has_majority:
            out.append(WorkerCheck(wid, NO_MAJORITY, details={"group": group_of[name].group}))
        else:
            out.append(WorkerCheck(wid, AGREES, details={"group": group_of[name].group}))
    return out


def history(session: Session, worker_id: int, *, limit: int, offset: int) -> tuple[list[WorkerEvent], int]:
    """The worker's events, newest first."""
    return paginate(session, select(WorkerEvent).where(WorkerEvent.worker_id == worker_id), limit=limit,
                    offset=offset, order_by=WorkerEvent.id.desc())


def recent_checks(session: Session, *, studies: int) -> tuple[list[int], list[WorkerEvent]]:
    """The last ``studies`` fleet checks (study ids, newest first) and every worker's result in them."""
    study_ids = list(session.scalars(
        select(WorkerEvent.study_id).where(WorkerEvent.kind == CHECK, WorkerEvent.study_id.is_not(None))
        .group_by(WorkerEvent.study_id).order_by(func.max(WorkerEvent.id).desc()).limit(studies)))
    if not study_ids:
        return [], []
    events = list(session.scalars(select(WorkerEvent).where(WorkerEvent.kind == CHECK,
                                                            WorkerEvent.study_id.in_(study_ids))))
    return [int(s) for s in study_ids if s is not None], events


def _rule(session: Session) -> AlertRule:
    """The one system rule every worker's quarantine alert hangs on (created on first use)."""
    stmt = select(AlertRule).where(AlertRule.source == RULE_SOURCE, AlertRule.kind == RULE_KIND)
    rule = session.scalars(stmt.order_by(AlertRule.id)).first()
    if rule is not None:
        return rule
    try:
        with session.begin_nested():
            rule = AlertRule(name=RULE_NAME, kind=RULE_KIND, severity="critical", params={}, source=RULE_SOURCE)
            session.add(rule)
            session.flush()
        return rule
    except IntegrityError:  # pragma: no cover - no unique constraint names it today; kept for safety
        return session.scalars(stmt.order_by(AlertRule.id)).one()


def _alert(session: Session, worker: Worker, *, firing: bool, summary: str, base_url: str) -> Alert:
    """Fire (or resolve) the worker's quarantine alert and queue its deliveries."""
    rule = _rule(session)
    key = dedupe_key(rule.id, f"worker:{worker.id}", None, {})
    alert = session.scalars(select(Alert).where(Alert.dedupe_key == key)).first()
    now = utcnow()
    link = f"{base_url.rstrip('/')}/fleet#worker-{worker.id}"
    details = {"worker_id": worker.id, "worker": worker.name, "reason": worker.quarantine_reason,
               "quarantined_by": worker.quarantined_by}
    if alert is None:
        alert = Alert(dedupe_key=key, rule_id=rule.id, kind=rule.kind, severity=rule.severity,
                      state="firing" if firing else "resolved", study_id=worker.quarantine_study_id, suite=None,
                      metric=None, group={"worker": worker.name, "worker_id": worker.id}, summary=summary,
                      details=details, link=link, fire_count=1, first_fired_at=now, last_fired_at=now,
                      evaluated_at=now, resolved_at=None if firing else now)
        session.add(alert)
    else:
        if firing:
            alert.fire_count += 1
            alert.state, alert.resolved_at, alert.last_fired_at = "firing", None, now
            alert.acked_at = alert.acked_by = None
            alert.study_id = worker.quarantine_study_id
        else:
            alert.state, alert.resolved_at = "resolved", now
        alert.summary, alert.details, alert.link, alert.evaluated_at = summary, details, link, now
    session.flush()
    enqueue(session, alert, "firing" if firing else "resolved")
    return alert
