"""Study schedules: kept in the database, so one made before a restart fires after it, once; a due schedule
fires once however many API processes look at it (two apps on one database, and two claimers racing on
PostgreSQL); bad input is answered 422 naming its field."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from steady.server.kit.db import Database
from steady.server.models import ApiToken, Study, StudySchedule, utcnow
from steady.server.studies import schedules
from steady.server.web.main import create_app
from tests.api.helpers import spec
from tests.conftest import POSTGRES_ONLY, add_tokens, make_settings, wait_until


def _studies(database: Database) -> list[tuple]:
    """(id, name, status, owner token) of every study."""
    with database.read() as session:
        return list(session.execute(select(Study.id, Study.name, Study.status, Study.owner_token_id)
                                    .order_by(Study.id)).tuples())


def _schedule(api, **body) -> dict:
    r = api.post("/api/v1/schedules", json={"name": "nightly fleet", "spec": spec(seeds=[0], repeats=1), **body})
    assert r.status_code == 201, r.text
    return r.json()


def test_a_schedule_made_before_a_restart_fires_once_after_it(db_url, tmp_path, clock):
    first = create_app(make_settings(db_url, tmp_path))
    with TestClient(first) as client:
        tokens = add_tokens(first)
        r = client.post("/api/v1/schedules", headers={"Authorization": f"Bearer {tokens['user']}"},
                        json={"name": "every 6h", "spec": spec(name="canary", seeds=[0], repeats=1), "every": "6h"})
        assert r.status_code == 201, r.text
        due = datetime.fromisoformat(r.json()["next_due_at"])
        assert timedelta(hours=6) - timedelta(minutes=1) < due - utcnow() <= timedelta(hours=6)
    clock.advance(13 * 3600)  # the server was down when the schedule fell due, twice (at 6 h and 12 h)
    # two API processes start on the same database; each runs the scheduler's loop
    apps = [create_app(make_settings(db_url, tmp_path, schedule_interval_seconds=0.05)) for _ in range(2)]
    with TestClient(apps[0]), TestClient(apps[1]):
        database = apps[0].state.database
        wait_until(lambda: _studies(database), timeout=60, what="the scheduled study")
        with database.read() as session:
            row = session.scalars(select(StudySchedule)).one()
            assert row.next_due_at > utcnow()  # moved on: nothing is due any more
            next_due = row.next_due_at
        # both loops keep ticking; a tick of each, run here, finds nothing due
        assert schedules.fire_due(database, apps[0].state.settings) == []
        assert schedules.fire_due(apps[1].state.database, apps[1].state.settings) == []
        studies = _studies(database)
    assert [s[1:3] for s in studies] == [("canary", "queued")]
    db = Database(db_url)
    with db.read() as session:
        row = session.scalars(select(StudySchedule)).one()
        assert (row.fired_count, row.last_study_id, row.last_error) == (1, studies[0][0], None)
        assert row.next_due_at == next_due == due + timedelta(hours=12)  # fired once for both; next at 18 h
        assert studies[0][3] == row.owner_token_id  # submitted as the schedule's creator
    db.dispose()


@POSTGRES_ONLY
def test_two_claimers_of_one_due_schedule_submit_one_study(db_url, tmp_path, clock):
    app = create_app(make_settings(db_url, tmp_path, schedule_interval_seconds=3600))
    with TestClient(app) as client:
        tokens = add_tokens(app)
        for i in range(8):
            r = client.post("/api/v1/schedules", headers={"Authorization": f"Bearer {tokens['user']}"},
                            json={"name": f"s{i}", "spec": spec(name=f"s{i}", seeds=[0], repeats=1), "every": "1h"})
            assert r.status_code == 201, r.text
        settings = app.state.settings
    clock.advance(3601)
    # Both claimers read the same due schedule before either claims: the second's UPDATE matches no row.
    a, b = Database(db_url), Database(db_url)
    try:
        with a.read() as session:
            (first_id, seen), *_ = schedules.due(session, utcnow())
        with b.read() as session:
            assert (first_id, seen) in schedules.due(session, utcnow())
        assert schedules.fire(a, settings, first_id, seen) is not None
        assert schedules.fire(b, settings, first_id, seen) is None
        # The other seven, raced by two threads on their own connections
        barrier = threading.Barrier(2)
        submitted: list[list[int]] = [[], []]

        def claimer(i: int, database: Database) -> None:
            barrier.wait()
            submitted[i] = schedules.fire_due(database, settings)

        threads = [threading.Thread(target=claimer, args=(i, d)) for i, d in enumerate((a, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with a.read() as session:
            per_name = dict(session.execute(select(Study.name, func.count()).group_by(Study.name)).tuples().all())
            fired = dict(session.execute(select(StudySchedule.name, StudySchedule.fired_count)).tuples().all())
    finally:
        a.dispose()
        b.dispose()
    assert len(submitted[0]) + len(submitted[1]) == 7 and not set(submitted[0]) & set(submitted[1])
    assert per_name == {f"s{i}": 1 for i in range(8)}
    assert fired == {f"s{i}": 1 for i in range(8)}


def test_daily_schedules_fire_at_the_next_utc_time():
    at = datetime(2026, 3, 1, 10, 30, tzinfo=UTC)
    assert schedules.next_daily("02:00", at) == datetime(2026, 3, 2, 2, 0, tzinfo=UTC)
    assert schedules.next_daily("10:31", at) == datetime(2026, 3, 1, 10, 31, tzinfo=UTC)
    assert schedules.next_daily("10:30", at) == datetime(2026, 3, 2, 10, 30, tzinfo=UTC)  # strictly after


@pytest.mark.backends("sqlite")
def test_schedules_are_listed_deleted_by_their_owner_and_refuse_bad_input(api):
    made = _schedule(api, daily="02:30")
    assert made["daily_at"] == "02:30" and made["every_seconds"] is None
    assert [s["name"] for s in api.get("/api/v1/schedules").json()["items"]] == ["nightly fleet"]
    for body, loc in (({"every": "5s"}, ["body", "every"]), ({"every": "6 hours"}, ["body", "every"]),
                      ({"daily": "25:00"}, ["body", "daily"]), ({}, ["body"]),
                      ({"every": "1h", "daily": "01:00"}, ["body"]),
                      ({"every": "1h", "spec": spec(seeds="x")}, ["body", "spec", "seeds"])):
        r = api.post("/api/v1/schedules", json={"name": "other", "spec": spec(), **body})
        assert r.status_code == 422, (body, r.text)
        assert r.json()["detail"][0]["loc"][:len(loc)] == loc, (body, r.text)
    r = api.post("/api/v1/schedules", json={"name": "nightly fleet", "spec": spec(), "every": "1h"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "name"]
    assert api.delete(f"/api/v1/schedules/{made['id']}", role="worker").status_code == 403
    assert api.delete(f"/api/v1/schedules/{made['id']}").status_code == 204
    assert api.get("/api/v1/schedules").json()["items"] == []
    assert api.delete(f"/api/v1/schedules/{made['id']}").status_code == 404


@pytest.mark.backends("sqlite")
def test_a_schedule_whose_owner_token_was_revoked_submits_nothing_and_says_why(api, clock):
    made = _schedule(api, every="1h")
    with api.app.state.database.write() as session:
        session.get(ApiToken, made["owner_token_id"]).revoked_at = utcnow()
    clock.advance(3601)
    assert schedules.fire_due(api.app.state.database, api.app.state.settings) == []
    (row,) = api.get("/api/v1/schedules", role="admin").json()["items"]
    assert row["fired_count"] == 1 and row["last_study_id"] is None
    assert row["last_error"] == "its owner's token was revoked or deleted: no study submitted"
    assert _studies(api.app.state.database) == []
