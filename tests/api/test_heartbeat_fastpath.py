"""The heartbeat's short way past routing (app/web/fastpath.py) answers what the route answers."""

from __future__ import annotations

from steady.server.web import fastpath
from tests.api.helpers import error_of, lease, register, spec


def _spy(monkeypatch) -> list:
    """Counts the heartbeats the short way wrote (a spy that delegates; the database is real)."""
    calls: list = []
    real = fastpath.HeartbeatBatch.submit

    async def submit(self, app, item):
        ack = await real(self, app, item)
        calls.append(ack)
        return ack

    monkeypatch.setattr(fastpath.HeartbeatBatch, "submit", submit)
    return calls


def test_a_heartbeat_answered_past_the_route_is_the_routes_answer(api, monkeypatch):
    calls = _spy(monkeypatch)
    api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["strict"]))
    wid = register(api)
    leased = lease(api, wid)
    run_id, lid = leased["run_id"], leased["lease_id"]
    url = f"/api/v1/runs/{run_id}/heartbeat"
    first = api.post(url, role="worker", json={"lease_id": lid, "step": 3})
    second = api.post(url, role="worker", json={"lease_id": lid, "step": 4})
    assert first.status_code == second.status_code == 200
    assert len([c for c in calls if not isinstance(c, BaseException)]) >= 1  # the token was cached by then
    assert set(first.json()) == set(second.json()) == {"lease_expires_at", "cancel"}
    assert second.json()["lease_expires_at"] >= first.json()["lease_expires_at"]
    for name in ("x-content-type-options", "x-frame-options", "content-security-policy"):
        assert first.headers[name] == second.headers[name]
    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["progress_step"] == 4 and run["status"] == "running"
    # refusals are the route's: a lease that is not this run's, a body that does not validate
    lost = api.post(url, role="worker", json={"lease_id": "f" * 32})
    assert lost.status_code == 409 and error_of(lost)["type"] == "lease_lost"
    bad = api.post(url, role="worker", json={"lease_id": lid, "step": "three"})
    assert bad.status_code == 422 and "step" in error_of(bad)["loc"]
    # the run is cancelled: the next heartbeat says so, through the short way too
    study_id = api.get(f"/api/v1/runs/{run_id}").json()["study_id"]
    assert api.post(f"/api/v1/studies/{study_id}/cancel").status_code == 200
    assert api.post(url, role="worker", json={"lease_id": lid}).json()["cancel"] is True
