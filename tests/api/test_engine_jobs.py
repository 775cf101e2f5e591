"""Engine jobs on the wire: a lease scoped to one study, the pending count that lets a batch
agent exit when idle, the engine job recorded on each run, and launches for ``steady status``."""

from __future__ import annotations

from tests.api.helpers import result, spec

SLURM_TASK = {"engine": "slurm", "job_id": "4242_1", "node": "gpu-node-07",
              "detail": {"array_job_id": "4242", "array_task_id": "1", "cuda_visible_devices": "0"}}


def _register(api, name: str, engine: dict | None = None) -> int:
    body = {"name": name, "labels": ["torch", "cpu"], **({"engine": engine} if engine else {})}
    r = api.post("/api/v1/workers/register", role="worker", json=body)
    assert r.status_code == 200, r.text
    return r.json()["worker_id"]


def _lease(api, worker_id: int, study_id: int | None = None):
    r = api.post(f"/api/v1/workers/{worker_id}/lease", role="worker", json={"worker_id": worker_id, "study_id": study_id})
    assert r.status_code in (200, 204), r.text
    return r


def test_lease_scoped_to_a_study_and_pending_count(api):
    a = api.post("/api/v1/studies", json=spec(name="a", seeds=[0], repeats=2, determinism=["seeded"])).json()["id"]
    b = api.post("/api/v1/studies", json=spec(name="b", seeds=[0], repeats=1, determinism=["seeded"])).json()["id"]
    w1, w2 = _register(api, "w1", SLURM_TASK), _register(api, "w2")

    leases = [_lease(api, w1, b).json(), _lease(api, w2, b)]
    assert leases[0]["study_id"] == b
    assert leases[1].status_code == 204 and leases[1].headers["X-Steady-Pending"] == "1"  # w1 still runs b's run

    r = api.post(f"/api/v1/runs/{leases[0]['run_id']}/complete", role="worker", json=result(leases[0]["lease_id"]))
    assert r.status_code == 200, r.text
    idle = _lease(api, w2, b)
    assert idle.status_code == 204 and idle.headers["X-Steady-Pending"] == "0"  # study b: nothing left

    got = _lease(api, w1, a).json()
    assert got["study_id"] == a
    unscoped = _lease(api, w2)
    assert unscoped.status_code == 200 and unscoped.json()["study_id"] == a
    assert _lease(api, w2).headers["X-Steady-Pending"] == "2"
    missing = _lease(api, w2, 10_000)
    assert missing.status_code == 204 and missing.headers["X-Steady-Pending"] == "0"


def test_each_run_records_the_engine_job_of_its_worker(api):
    study = api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["seeded"])).json()["id"]
    worker = _register(api, "steady-4242_1", SLURM_TASK)
    lease = _lease(api, worker, study).json()
    run = api.get(f"/api/v1/runs/{lease['run_id']}").json()
    assert run["engine"] == SLURM_TASK
    listed = {w["name"]: w for w in api.get("/api/v1/workers").json()["items"]}
    assert listed["steady-4242_1"]["engine"] == SLURM_TASK
    page = api.get(f"/runs/{lease['run_id']}")
    assert page.status_code == 200
    assert "slurm 4242_1 on gpu-node-07" in page.text and "sacct -j 4242_1" in page.text
    assert "slurm 4242_1 on gpu-node-07" in api.get("/workers").text

    # A worker without an engine job leaves the field empty; a bad engine job is refused.
    plain = _register(api, "plain")
    assert api.get("/api/v1/workers").json()["items"][-1]["engine"] is None
    r = api.post("/api/v1/workers/register", role="worker",
                 json={"name": "bad", "engine": {"engine": "Slurm Cluster!", "job_id": "1"}})
    assert r.status_code == 422
    assert plain


def test_launches_are_recorded_and_listed(api):
    study = api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1)).json()["id"]
    body = {"engine": "slurm", "job_id": "4242", "tasks": 2, "detail": {"partition": "gpu"}}
    r = api.post(f"/api/v1/studies/{study}/launches", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["job_id"] == "4242" and r.json()["study_id"] == study
    assert [x["job_id"] for x in api.get(f"/api/v1/studies/{study}/launches").json()["items"]] == ["4242"]
    assert [x["engine"] for x in api.get("/api/v1/launches").json()["items"]] == ["slurm"]
    assert api.post("/api/v1/studies/999999/launches", json=body).status_code == 404
    assert api.post(f"/api/v1/studies/{study}/launches", role="worker", json=body).status_code == 403
    assert api.post(f"/api/v1/studies/{study}/launches", json={**body, "tasks": 0}).status_code == 422
