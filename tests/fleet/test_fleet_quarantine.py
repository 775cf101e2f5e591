"""A fleet check that asks for quarantine (``fleet.quarantine: true``), end to end in process: when it
finishes, the evaluation job records every worker's result in its history and quarantines the worker whose
runs part from its peers'; that worker then leases no run of an ordinary study (which respects quarantine)
but still takes its pinned run of the next fleet check (which re-tests quarantined workers), and leases
ordinary runs again once an admin releases it."""

from __future__ import annotations

import numpy as np

from steady.server.alerts import jobs
from tests.api.helpers import batch, lease, register, result, spec
from tests.conftest import SQLITE_ONLY

pytestmark = SQLITE_ONLY  # the lease query's quarantine runs on both backends in tests/alerts/test_quarantine.py

STEPS = np.arange(10)
HEALTHY = np.linspace(2.0, 0.5, 10)
WRONG = HEALTHY.copy()
WRONG[6:] = np.nextafter(WRONG[6:], 10.0)  # a consistently wrong kernel: one ULP up from step 6 on


def _fleet(api, **fleet) -> int:
    r = api.post("/api/v1/studies", json={
        "name": "nightly fleet", "workload": {"framework": "torch", "name": "fleet_canary"}, "seeds": [0],
        "determinism": ["strict"], "metrics": ["loss"], "fleet": fleet})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _complete(api, got: dict, values: np.ndarray) -> None:
    body = batch(got["lease_id"], 0, "loss", STEPS.tolist(), values.tolist())
    assert api.post(f"/api/v1/runs/{got['run_id']}/metrics", role="worker", json=body).status_code == 200
    digest = "f" * 64 if values is HEALTHY else "e" * 64
    r = api.post(f"/api/v1/runs/{got['run_id']}/complete", role="worker", json=result(
        got["lease_id"], digests={"initial_weights": "a" * 64, "final_weights": digest},
        fingerprint={"framework": "torch", "cpu_model": "test cpu"}, determinism_applied={"level": "strict"}))
    assert r.status_code == 200, r.text


def test_a_fleet_check_quarantines_the_worker_it_names_and_an_admin_lifts_it(api):
    workers = {f"w{i}": register(api, f"w{i}") for i in range(4)}
    sid = _fleet(api, repeats=2, quarantine=True)
    for name, wid in workers.items():
        while (got := lease(api, wid)) is not None:
            _complete(api, got, WRONG if name == "w2" else HEALTHY)
    assert api.get(f"/api/v1/studies/{sid}").json()["status"] == "completed"
    jobs.run_pending_evaluations(api.app.state.database, base_url="http://steady.test")  # the dispatcher's tick

    listed = {w["name"]: w for w in api.get("/api/v1/workers").json()["items"]}
    assert [n for n, w in listed.items() if w["quarantine"]] == ["w2"]
    q = listed["w2"]["quarantine"]
    assert q["study_id"] == sid and q["by"] == f"fleet check (study {sid})"
    assert q["reason"] == "2 of its 2 runs part from its peers' from step 6 in fleet check 'nightly fleet'"
    (quarantined, check) = api.get(f"/api/v1/workers/{workers['w2']}/history").json()["items"]
    assert (quarantined["kind"], check["kind"], check["verdict"], check["first_divergent_step"]) == (
        "quarantined", "check", "faulty", 6)
    assert check["details"]["kind"] == "consistent" and check["details"]["parted"] == 2
    for name in ("w0", "w1", "w3"):
        (healthy,) = api.get(f"/api/v1/workers/{workers[name]}/history").json()["items"]
        assert (healthy["kind"], healthy["verdict"], healthy["study_id"]) == ("check", "agrees", sid)
    firing = api.get("/api/v1/alerts", params={"state": "firing"}).json()["items"]
    assert [a["kind"] for a in firing] == ["worker_quarantine"] and "worker w2 quarantined" in firing[0]["summary"]

    ordinary = api.post("/api/v1/studies", json=spec(name="training", seeds=[0], repeats=1,
                                                      determinism=["strict"])).json()["id"]
    recheck = _fleet(api, repeats=1, workers=["w2"])
    got = lease(api, workers["w2"])
    assert got is not None and got["study_id"] == recheck  # the fleet check's pinned run; the ordinary one skipped
    assert lease(api, workers["w2"]) is None
    assert api.post(f"/api/v1/workers/{workers['w2']}/release", role="admin", json={}).status_code == 200
    assert lease(api, workers["w2"])["study_id"] == ordinary


def test_a_worker_takes_its_fleet_canary_at_its_next_lease_before_older_queued_runs(api):
    w = register(api, "w0")
    older = api.post("/api/v1/studies", json=spec(name="training", seeds=[0, 1], repeats=2,
                                                   determinism=["strict"])).json()["id"]
    first = lease(api, w)
    assert first["study_id"] == older  # a job is running
    canary = _fleet(api, repeats=1)  # queued after four runs of the training study
    assert lease(api, w)["study_id"] == canary  # between its jobs: the canary pinned to it first
    assert lease(api, w)["study_id"] == older
