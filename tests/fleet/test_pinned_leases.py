"""Pinned runs at the lease: a run pinned to a worker is leased by that worker only, never by another,
does not hide unpinned runs from the others, and fails with the reason once its worker has not taken
it by its deadline. On SQLite and PostgreSQL (the lease query differs: SKIP LOCKED)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from steady.server.models import Run, utcnow
from tests.api.helpers import lease, register, spec


def _study(api, runs: int) -> list[int]:
    r = api.post("/api/v1/studies", json=spec(seeds=[0], repeats=runs, determinism=["strict"]))
    assert r.status_code == 201, r.text
    with api.app.state.database.read() as session:
        return list(session.scalars(select(Run.id).where(Run.study_id == r.json()["id"]).order_by(Run.id)))


def _pin(api, run_ids: list[int], worker_id: int, seconds: float = 600.0) -> None:
    with api.app.state.database.write() as session:
        session.execute(update(Run).where(Run.id.in_(run_ids)).values(
            pinned_worker=worker_id, pinned_until=utcnow() + timedelta(seconds=seconds)))


def test_a_pinned_run_goes_to_its_worker_only(api):
    runs = _study(api, 2)
    w1, w2 = register(api, "w1"), register(api, "w2")
    _pin(api, runs, w2)
    assert lease(api, w1) is None  # queued runs exist, but none w1 may take
    first, second = lease(api, w2), lease(api, w2)
    assert {first["run_id"], second["run_id"]} == set(runs)
    assert lease(api, w1) is None


def test_pins_of_another_worker_do_not_hide_unpinned_runs(api):
    runs = _study(api, 3)
    w1, w2 = register(api, "w1"), register(api, "w2")
    _pin(api, runs[:2], w2)  # the first runs in lease order are w2's
    got = lease(api, w1)
    assert got is not None and got["run_id"] == runs[2]
    assert lease(api, w1) is None


def test_a_pin_not_taken_by_its_deadline_fails_with_the_reason(make_api, clock):
    api = make_api(lease_seconds=3600)  # the lease taken below outlives the pin's deadline
    runs = _study(api, 2)
    w1, w2 = register(api, "w1"), register(api, "gone-worker")
    _pin(api, runs[:1], w2, seconds=60)
    _pin(api, runs[1:], w1, seconds=60)
    assert lease(api, w1)["run_id"] == runs[1]
    clock.advance(120)  # past the pin's deadline; w2 never asked for work
    assert lease(api, w1) is None  # the lease path reaps: the expired pin fails, and goes to nobody
    body = api.get(f"/api/v1/runs/{runs[0]}").json()
    assert body["status"] == "failed"
    assert "pinned to worker gone-worker" in body["error"] and "did not take it by" in body["error"]
    assert lease(api, w2) is None  # too late: a failed run is not leased again
    running = api.get(f"/api/v1/runs/{runs[1]}").json()
    assert running["status"] == "running"  # a pin its worker took is not touched by the deadline
