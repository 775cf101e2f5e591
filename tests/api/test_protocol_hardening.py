"""Issue #13, protocol part: safe retries, writes bound to the leasing worker, per-worker lease
cap, a server-side time limit and per-run data limits."""

from __future__ import annotations

from datetime import timedelta

from tests.api.helpers import batch, error_msg, error_of, register, result, spec
from steady.worker.contract.protocol import Series


def _study(api, runs: int = 1, **kw):
    body = spec(seeds=list(range(runs)), repeats=1, determinism=["strict"], **kw)
    r = api.post("/api/v1/studies", json=body)
    assert r.status_code == 201 or r.status_code == 200, r.text
    return r.json()["id"]


def _lease(api, wid: int, request_id: str | None = None, role: str = "worker"):
    body = {"worker_id": wid} if request_id is None else {"worker_id": wid, "request_id": request_id}
    return api.post(f"/api/v1/workers/{wid}/lease", role=role, json=body)


def _second_worker_token(api) -> str:
    from steady.server.kit.auth import Role, create_token

    with api.app.state.database.write() as session:
        api.tokens["worker2"] = create_token(session, name="other-worker", role=Role.worker)[1]
    return "worker2"


def test_repeated_lease_request_gets_the_same_run(api):
    _study(api, runs=3)
    wid = register(api)
    first = _lease(api, wid, "req-lease-0001")
    again = _lease(api, wid, "req-lease-0001")  # the first answer was lost; the client retries
    assert first.status_code == again.status_code == 200
    assert again.json()["run_id"] == first.json()["run_id"]
    assert again.json()["lease_id"] == first.json()["lease_id"] and again.json()["attempt"] == 1
    other = _lease(api, wid, "req-lease-0002")  # a new call leases a new run
    assert other.status_code == 200 and other.json()["run_id"] != first.json()["run_id"]
    running = [r for r in api.get("/api/v1/workers").json()["items"] if r["id"] == wid][0]["running_runs"]
    assert sorted(running) == sorted([first.json()["run_id"], other.json()["run_id"]])


def test_repeated_complete_gets_the_original_ack_and_codes_tell_lost_from_finished(api):
    _study(api)
    wid = register(api)
    leased = _lease(api, wid, "req-lease-0001").json()
    run_id, lid = leased["run_id"], leased["lease_id"]
    first = api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid, request_id="req-done-0001"))
    again = api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid, request_id="req-done-0001"))
    assert first.status_code == again.status_code == 200
    assert again.json() == {"run_id": run_id, "status": "completed", "duplicate": True}
    other = api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid, request_id="req-done-0002"))
    assert other.status_code == 409 and error_of(other)["type"] == "already_finished"
    fail = api.post(f"/api/v1/runs/{run_id}/fail", role="worker", json={"lease_id": lid, "error": "x"})
    assert fail.status_code == 409 and error_of(fail)["type"] == "already_finished"
    lost = api.post(f"/api/v1/runs/{run_id}/heartbeat", role="worker", json={"lease_id": "f" * 32})
    assert lost.status_code == 409 and error_of(lost)["type"] == "lease_lost"


def test_repeated_release_and_fail_get_the_original_ack(api):
    _study(api, runs=2)
    wid = register(api)
    a = _lease(api, wid, "req-lease-0001").json()
    body = {"lease_id": a["lease_id"], "request_id": "req-release-01"}
    assert api.post(f"/api/v1/runs/{a['run_id']}/release", role="worker", json=body).json()["status"] == "queued"
    again = api.post(f"/api/v1/runs/{a['run_id']}/release", role="worker", json=body)
    assert again.status_code == 200 and again.json() == {"run_id": a["run_id"], "status": "queued", "duplicate": True}
    assert api.get(f"/api/v1/runs/{a['run_id']}").json()["attempt"] == 0  # released once, not twice
    b = _lease(api, wid, "req-lease-0002").json()
    fbody = {"lease_id": b["lease_id"], "request_id": "req-fail-0001", "error": "boom"}
    assert api.post(f"/api/v1/runs/{b['run_id']}/fail", role="worker", json=fbody).json()["status"] == "failed"
    again = api.post(f"/api/v1/runs/{b['run_id']}/fail", role="worker", json=fbody)
    assert again.status_code == 200 and again.json()["duplicate"] is True


def test_run_writes_are_bound_to_the_leasing_worker(api):
    _study(api)
    wid = register(api)
    leased = _lease(api, wid).json()
    run_id, lid = leased["run_id"], leased["lease_id"]
    intruder = _second_worker_token(api)
    attempts = [
        api.post(f"/api/v1/runs/{run_id}/heartbeat", role=intruder, json={"lease_id": lid}),
        api.post(f"/api/v1/runs/{run_id}/metrics", role=intruder, json=batch(lid, 0, "loss", [0], [1.0])),
        api.post(f"/api/v1/runs/{run_id}/complete", role=intruder, json=result(lid)),
        api.post(f"/api/v1/runs/{run_id}/fail", role=intruder, json={"lease_id": lid, "error": "x"}),
        api.post(f"/api/v1/runs/{run_id}/release", role=intruder, json={"lease_id": lid}),
    ]
    for r in attempts:
        assert r.status_code == 403 and error_of(r)["type"] == "not_lease_holder", r.text
    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "running" and run["metric_keys"] == []
    assert api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid)).status_code == 200


def test_leases_per_worker_are_capped(make_api):
    api = make_api(max_leases_per_worker=2)
    _study(api, runs=4)
    wid = register(api)
    assert _lease(api, wid).status_code == 200
    assert _lease(api, wid).status_code == 200
    third = _lease(api, wid)
    assert third.status_code == 429 and "STEADY_MAX_LEASES_PER_WORKER" in error_msg(third)
    assert error_of(third)["type"] == "lease_cap" and third.headers["Retry-After"]


def test_server_fails_a_run_past_its_time_limit_despite_heartbeats(make_api):
    from steady.server.models import Run
    from steady.server.lifecycle.leasing import reap_expired

    api = make_api(time_limit_grace_seconds=5.0, lease_seconds=3600.0)
    _study(api, time_limit_s=10.0)
    wid = register(api)
    leased = _lease(api, wid).json()
    run_id, lid = leased["run_id"], leased["lease_id"]
    assert api.post(f"/api/v1/runs/{run_id}/heartbeat", role="worker", json={"lease_id": lid}).status_code == 200
    # The injected clock counts from the run's own deadline (lease time + limit + grace), not from now: on a
    # loaded machine seconds pass between the lease and the reap
    with api.app.state.database.read() as session:
        row = session.get(Run, run_id)
        deadline = row.time_limit_at
        assert deadline - row.started_at == timedelta(seconds=10.0 + 5.0)  # time_limit_s + the grace
    with api.app.state.database.write() as session:  # within limit + grace
        reap_expired(session, deadline - timedelta(seconds=1))
    assert api.get(f"/api/v1/runs/{run_id}").json()["status"] == "running"
    with api.app.state.database.write() as session:  # past it, the lease still valid
        reap_expired(session, deadline + timedelta(seconds=1))
    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "failed" and run["failure_kind"] == "timeout", run
    late = api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid))
    assert late.status_code == 409 and error_of(late)["type"] == "already_finished"


def test_keys_per_run_are_capped(make_api):
    api = make_api(max_keys_per_run=3)
    _study(api)
    leased = _lease(api, register(api)).json()
    run_id, lid = leased["run_id"], leased["lease_id"]
    for seq, key in enumerate(["a", "b", "c"]):
        assert api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=batch(lid, seq, key, [0], [1.0])).status_code == 200
    assert api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=batch(lid, 3, "a", [1], [1.0])).status_code == 200
    r = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=batch(lid, 4, "d", [0], [1.0]))
    assert r.status_code == 422 and "STEADY_MAX_KEYS_PER_RUN" in r.text
    many = {"lease_id": lid, "seq": 5, "series": [Series.packed(f"k{i}", [0], [0.0]).model_dump(exclude_none=True) for i in range(200)]}
    r = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=many)
    assert r.status_code == 422 and "STEADY_MAX_KEYS_PER_RUN" in r.text
    assert api.get(f"/api/v1/runs/{run_id}").json()["metric_keys"] == ["a", "b", "c"]


def test_points_per_run_are_capped(make_api):
    api = make_api(max_points_per_run=1000)
    _study(api)
    leased = _lease(api, register(api)).json()
    run_id, lid = leased["run_id"], leased["lease_id"]
    steps = list(range(600))
    assert api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=batch(lid, 0, "loss", steps, [0.0] * 600)).status_code == 200
    r = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=batch(lid, 1, "loss", [s + 600 for s in steps], [0.0] * 600))
    assert r.status_code == 422 and "STEADY_MAX_POINTS_PER_RUN" in r.text
    # a re-sent batch already stored is still acknowledged (idempotent), not refused
    again = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=batch(lid, 0, "loss", steps, [0.0] * 600))
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert api.get(f"/api/v1/runs/{run_id}/metrics/loss").json()["n"] == 600
