"""The heartbeat's short way past routing (app/web/fastpath.py) answers what the route answers."""

from __future__ import annotations

from sqlalchemy import select

from steady.server.kit.auth import Role, create_token
from steady.server.kit.deps import Principal
from steady.server.lifecycle import transitions
from steady.server.models import ApiToken, Run
from steady.server.web import fastpath
from steady.worker.contract.protocol import Heartbeat
from tests.api.helpers import error_of, lease, register, spec
from tests.conftest import POSTGRES_ONLY


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



@POSTGRES_ONLY
def test_heartbeats_written_together_extend_only_the_callers_live_leases(api):
    """One statement for a group (``transitions.heartbeat_many``): each heartbeat is answered as if alone.
    A worker's own lease is extended (its step kept where the heartbeat has none); a run held by another
    token's worker and a wrong lease id match nothing and change nothing."""
    api.post("/api/v1/studies", json=spec(seeds=[0, 1, 2], repeats=1, determinism=["strict"]))
    with api.app.state.database.write() as session:
        _, other = create_token(session, name="other-worker", role=Role.worker)
        me = Principal(token_id=session.scalar(select(ApiToken.id).where(ApiToken.name == "test-worker")),
                       name="test-worker", role=Role.worker)
    mine = [lease(api, register(api, name=f"w{i}")) for i in range(2)]
    for run in mine:
        beat = api.post(f"/api/v1/runs/{run['run_id']}/heartbeat", role="worker",
                        json={"lease_id": run["lease_id"], "step": 5})
        assert beat.status_code == 200, beat.text
    as_other = {"Authorization": f"Bearer {other}"}
    theirs = api.client.post("/api/v1/workers/register", json={"name": "w-other", "labels": ["torch", "cpu"]},
                             headers=as_other).json()["worker_id"]
    taken = api.client.post(f"/api/v1/workers/{theirs}/lease", json={"worker_id": theirs}, headers=as_other).json()
    with api.app.state.database.read() as session:
        before = dict(session.execute(select(Run.id, Run.lease_expires_at)).tuples().all())
    settings = api.app.state.settings.model_copy(update={"lease_seconds": 3600.0})
    with api.app.state.protocol.database.write() as session:
        acks = transitions.heartbeat_many(session, [
            (mine[0]["run_id"], Heartbeat(lease_id=mine[0]["lease_id"], step=7), me),
            (mine[1]["run_id"], Heartbeat(lease_id=mine[1]["lease_id"]), me),
            (taken["run_id"], Heartbeat(lease_id=taken["lease_id"], step=9), me),
        ], settings)
    assert acks[2] is None
    for ack, run in zip(acks[:2], mine, strict=True):
        assert ack is not None and ack.lease_expires_at > before[run["run_id"]]
    with api.app.state.protocol.database.write() as session:
        wrong = transitions.heartbeat_many(session, [(mine[0]["run_id"], Heartbeat(lease_id="f" * 32, step=8), me)],
                                           settings)
    assert wrong == [None]
    with api.app.state.database.read() as session:
        after = {row.id: row for row in session.execute(select(Run.id, Run.progress_step, Run.lease_expires_at))}
    assert [after[run["run_id"]].progress_step for run in mine] == [7, 5]
    assert after[taken["run_id"]].progress_step is None
    assert after[taken["run_id"]].lease_expires_at == before[taken["run_id"]]
