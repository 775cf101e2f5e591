"""Fleet checks: one workload run ``repeats`` times on each worker of a pool, each run pinned to its worker.

A fleet check is a study (``fleet`` in its spec). Creating it resolves the pool (the workers registered and
seen within ``alive_s``, of the names given or carrying the labels given) and queues, per worker, ``repeats``
runs pinned to that worker (``runs.pinned_worker``) until ``wait_s`` from now: the queue, leases and report
are the study's own. The pool as resolved is kept in the stored spec (``fleet.pool``), so the report names
the workers that were asked, whether or not they ran.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from steady.server.kit.db import WriteSession
from steady.server.kit.errors import Invalid
from steady.server.models import Study, Worker, utcnow
from steady.server.runs import repository as runs_repo
from steady.server.studies.fleet_spec import FleetSpec
from steady.worker.contract.protocol import RunStatus


def resolve_pool(session: Session, fleet: FleetSpec, framework: str) -> list[Worker]:
    """The workers a fleet check runs on: seen within ``alive_s``, able to run ``framework``, carrying the
    spec's labels and, when it names workers, of those names. Refused (422) when none is."""
    since = utcnow() - timedelta(seconds=fleet.alive_s)
    workers = list(session.scalars(select(Worker).where(Worker.last_seen_at >= since).order_by(Worker.id)))
    want = {framework, *fleet.labels}
    pool = [w for w in workers if want <= set(w.labels or []) and (fleet.workers is None or w.name in fleet.workers)]
    if fleet.workers is not None:
        missing = sorted(set(fleet.workers) - {w.name for w in pool})
        if missing:
            raise Invalid(("body", "fleet", "workers"), f"no worker seen in the last {fleet.alive_s:g} s by the name(s) "
                          f"{', '.join(missing)} with the labels {', '.join(sorted(want))}: start them, or leave "
                          "them out of the pool")
    if not pool:
        raise Invalid(("body", "fleet"), f"no worker seen in the last {fleet.alive_s:g} s carries the labels "
                      f"{', '.join(sorted(want))}: a fleet check needs at least one (`steady worker` starts one)")
    return pool


def insert_fleet_runs(session: WriteSession, study: Study, pool: list[Worker], *, seed: int, repeats: int,
                      framework: str, max_attempts: int, wait_s: float) -> None:
    """Queue ``repeats`` runs at ``strict`` per worker of ``pool``, each pinned to its worker until ``wait_s``
    from now. Repeats are numbered across the pool (worker i's are i·repeats … i·repeats + repeats − 1), so
    every run of the study is a distinct repeat of its one seed."""
    now = utcnow()
    until = now + timedelta(seconds=wait_s)
    rows = [
        {
            "study_id": study.id, "seed": seed, "repeat": i * repeats + r, "determinism": "strict",
            "stack": "default", "framework": framework, "required_labels": [framework],
            "pinned_worker": worker.id, "pinned_until": until,
            "status": RunStatus.queued.value, "attempt": 0, "max_attempts": max_attempts, "cancel_requested": False,
            "fingerprint": {}, "digests": {}, "determinism_applied": {}, "timings": {}, "final_metrics": {},
            "created_at": now,
        }
        for r in range(repeats)  # one repeat on every worker, then the next: each worker can start at once
        for i, worker in enumerate(pool)
    ]
    runs_repo.insert_runs(session, rows)
