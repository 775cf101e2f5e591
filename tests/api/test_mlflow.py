"""The MLflow-compatible endpoint, driven by the real MLflow client (mlflow-skinny, pinned in the
``dev`` extra) in fresh processes, against a real ``steady serve``."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.api.helpers import register
from steady.worker.contract.protocol import Series

# not imported at collection (1.6 s of CPU for every parallel test worker): the tests' servers run it
pytestmark = [pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow is not installed"),
              pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
VALUES = [0.1 + 0.2, math.nan, 5e-324, math.inf, -math.inf, -0.0, 1 / 3, 1e308]

CLIENT = textwrap.dedent("""
    import json, math, sys
    import mlflow

    values = [float(v) for v in json.loads(sys.argv[2])]
    if sys.argv[1]:
        mlflow.set_experiment(sys.argv[1])
    run = mlflow.start_run(run_name="from-mlflow") if sys.argv[1] else None
    mlflow.log_param("seed", 3)
    mlflow.log_param("determinism", "seeded")
    for step, v in enumerate(values):
        mlflow.log_metric("loss", v, step=step)
    mlflow.log_metrics({"acc": 0.25, "lr": 1e-3}, step=0)
    mlflow.set_tag("team", "vision")
    active = mlflow.active_run()
    print(json.dumps({"run_id": active.info.run_id, "experiment_id": active.info.experiment_id}))
    mlflow.end_run()
""")


def _client(env: dict[str, str], experiment: str = "") -> dict:
    proc = subprocess.run([sys.executable, "-c", CLIENT, experiment, json.dumps([repr(v) for v in VALUES])],
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}, **env},
                          capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))


def _series(http, run_id: int, key: str):
    body = http.get(f"/api/v1/runs/{run_id}/metrics/{key}", params={"format": "packed"}).json()
    return Series(key=key, steps_b64=body["steps_b64"], values_b64=body["values_b64"]).unpacked()


def _same_bits(got: list[float], want: list[float]) -> bool:
    return np.array_equal(np.asarray(got, "<f8").view("<i8"), np.asarray(want, "<f8").view("<i8"))


def test_external_runs_from_an_unmodified_mlflow_client(live_server):
    http = live_server.client()
    env = {"MLFLOW_TRACKING_URI": live_server.url + "/mlflow", "MLFLOW_TRACKING_TOKEN": live_server.tokens["user"]}
    out = _client(env, "mlflow-imported")
    study = http.get(f"/api/v1/studies/{out['experiment_id']}").json()
    assert study["name"] == "mlflow-imported" and study["spec"]["kind"] == "external"
    run = http.get(f"/api/v1/runs/{out['run_id']}").json()
    assert run["status"] == "completed" and run["seed"] == 3 and run["determinism"] == "seeded"
    steps, values = _series(http, int(out["run_id"]), "loss")
    assert steps == list(range(len(VALUES))) and _same_bits(values, VALUES)  # exact, NaN and ±Inf included
    assert _series(http, int(out["run_id"]), "acc") == ([0], [0.25])
    # a second run finds the experiment by name
    again = _client(env, "mlflow-imported")
    assert again["experiment_id"] == out["experiment_id"] and again["run_id"] != out["run_id"]
    # a worker token is not an MLflow caller
    r = http.get("/mlflow/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": "mlflow-imported"},
                 headers=live_server.headers("worker"))
    assert r.status_code == 403 and r.json()["error_code"] == "PERMISSION_DENIED"


def test_unsupported_and_invalid_requests_answer_in_mlflow_shape(live_server):
    http = live_server.client()
    r = http.post("/mlflow/api/2.0/mlflow/runs/search", json={"experiment_ids": ["1"]})
    assert r.status_code == 501 and r.json()["error_code"] == "NOT_IMPLEMENTED"
    assert "runs/search" in r.json()["message"] and "docs/mlflow.md" in r.json()["message"]
    r = http.post("/mlflow/api/2.0/mlflow/runs/log-metric", json={"run_id": "1", "key": "loss", "value": "abc"})
    assert r.status_code == 422 and r.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert "value" in r.json()["message"]
    r = http.get("/mlflow/api/2.0/mlflow/runs/get", params={"run_id": "999999"})
    assert r.status_code == 404 and r.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    r = http.get("/mlflow/api/2.0/mlflow/runs/get", params={"run_id": "1"}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error_code"] == "UNAUTHENTICATED"


def test_run_credential_writes_its_own_run_while_its_lease_lasts(api):
    """In-process (TestClient): the credential issued with a lease writes that run only, and stops
    working when the run is reported."""
    from tests.api.helpers import lease, result, spec

    api.post("/api/v1/studies", json=spec(seeds=[0, 1], repeats=1, determinism=["seeded"]))
    wid = register(api)
    first, second = lease(api, wid), lease(api, wid)
    token = first["run_token"]
    assert token.startswith(f"stdr_{first['run_id']}_") and second["run_token"] != token
    h = {"Authorization": f"Bearer {token}"}
    base = "/mlflow/api/2.0/mlflow"
    ok = api.client.post(f"{base}/runs/log-metric", headers=h,
                         json={"run_id": str(first["run_id"]), "key": "mlf", "value": 0.5, "step": "2", "timestamp": "1"})
    assert ok.status_code == 200, ok.text
    dup = api.client.post(f"{base}/runs/log-metric", headers=h,  # a client retry stores nothing twice
                          json={"run_id": str(first["run_id"]), "key": "mlf", "value": 0.5, "step": "2", "timestamp": "1"})
    assert dup.status_code == 200
    got = api.get(f"/api/v1/runs/{first['run_id']}/metrics/mlf").json()
    assert got["steps"] == [2] and got["values"] == [0.5]
    other = api.client.post(f"{base}/runs/log-metric", headers=h,
                            json={"run_id": str(second["run_id"]), "key": "mlf", "value": 1.0})
    assert other.status_code == 403 and other.json()["error_code"] == "PERMISSION_DENIED"
    assert api.client.post(f"{base}/runs/create", headers=h, json={"experiment_id": "1"}).status_code == 403
    # the credential authenticates nothing outside the MLflow endpoint
    assert api.client.get("/api/v1/studies", headers=h).status_code == 401
    # the worker reports the run: the credential is dead
    assert api.post(f"/api/v1/runs/{first['run_id']}/complete", role="worker", json=result(first["lease_id"])).status_code == 200
    late = api.client.post(f"{base}/runs/log-metric", headers=h,
                           json={"run_id": str(first["run_id"]), "key": "mlf", "value": 2.0, "step": 3})
    assert late.status_code == 401 and late.json()["error_code"] == "UNAUTHENTICATED"
    with api.app.state.database.read() as s:
        from steady.server.models import Run

        stored = s.get(Run, first["run_id"]).run_token_hash
    assert stored and token not in stored


def test_mlflow_calls_inside_a_steady_run_land_in_it(live_server, tmp_path):
    """Unmodified ``mlflow.log_metric`` in user code run by a real worker: the worker sets
    MLFLOW_TRACKING_URI / MLFLOW_TRACKING_TOKEN (the run credential) / MLFLOW_RUN_ID."""
    script = tmp_path / "train_mlflow.py"
    script.write_text(textwrap.dedent("""
        import mlflow

        for step in range(5):
            mlflow.log_metric("mlflow_loss", 1.0 / (step + 1), step=step)
        mlflow.log_params({"lr": "0.1"})
        mlflow.end_run()
    """))
    http = live_server.client()
    r = http.post("/api/v1/studies", json={
        "name": "mlflow-inside", "metrics": ["mlflow_loss"], "seeds": [0], "repeats": 1, "determinism": ["none"],
        "threads": 1, "workload": {"framework": "torch", "entrypoint": str(script)}})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    env = {**os.environ, "STEADY_TOKEN": live_server.tokens["worker"]}
    proc = subprocess.run([sys.executable, "-m", "steady.worker", "--server", live_server.url, "--once",
                           "--work-dir", str(tmp_path / "agent")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = http.get(f"/api/v1/studies/{sid}/runs").json()["items"][0]
    assert run["status"] == "completed", (run, proc.stderr[-3000:])
    assert _series(http, run["id"], "mlflow_loss") == ([0, 1, 2, 3, 4], [1.0, 0.5, 1 / 3, 0.25, 0.2])


def test_a_run_credential_dies_with_its_lease(api):
    """Re-queued and leased again (here to a worker that asks for no credential): the first
    lease's credential writes nothing."""
    from tests.api.helpers import spec

    api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["seeded"]))
    wid = register(api)
    first = api.post(f"/api/v1/workers/{wid}/lease", role="worker", json={"worker_id": wid, "run_credential": True}).json()
    release = api.post(f"/api/v1/runs/{first['run_id']}/release", role="worker", json={"lease_id": first["lease_id"]})
    assert release.status_code == 200
    again = api.post(f"/api/v1/workers/{wid}/lease", role="worker", json={"worker_id": wid}).json()
    assert again["run_id"] == first["run_id"] and "run_token" not in again
    r = api.client.post("/mlflow/api/2.0/mlflow/runs/log-metric", headers={"Authorization": f"Bearer {first['run_token']}"},
                        json={"run_id": str(first["run_id"]), "key": "mlf", "value": 1.0, "step": 0})
    assert r.status_code == 401 and r.json()["error_code"] == "UNAUTHENTICATED"
