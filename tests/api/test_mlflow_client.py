"""Rows of docs/mlflow.md's support table, each driven by the real MLflow client (a fresh process)
against a real ``steady serve``: experiments by name per user, get_experiment, MlflowClient's
create_run, tags written and read back, and an unsupported method's clear error."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

# not imported at collection (1.6 s of CPU for every parallel test worker): the client runs in its own process
pytestmark = [pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow is not installed"),
              pytest.mark.slow]

SET_EXPERIMENT = textwrap.dedent("""
    import json, sys
    import mlflow

    experiment = mlflow.set_experiment(sys.argv[1])
    with mlflow.start_run() as run:
        mlflow.log_metric("loss", 0.5, step=1)
    print(json.dumps({"experiment_id": experiment.experiment_id, "run_id": run.info.run_id}))
""")

CLIENT_CALLS = textwrap.dedent("""
    import json, sys
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    experiment = client.get_experiment(sys.argv[1])
    run = client.create_run(sys.argv[1], tags={"team": "vision"}, run_name="made-by-client")
    client.set_tag(run.info.run_id, "stage", "warmup")
    client.log_metric(run.info.run_id, "loss", 0.25, step=2)
    got = client.get_run(run.info.run_id)
    try:
        client.delete_tag(run.info.run_id, "stage")
        unsupported = None
    except MlflowException as exc:
        unsupported = {"error_code": exc.error_code, "message": exc.message}
    client.set_terminated(run.info.run_id)
    print(json.dumps({"name": experiment.name, "experiment_id": experiment.experiment_id,
                      "run_id": run.info.run_id, "run_experiment": run.info.experiment_id,
                      "tags": got.data.tags, "metrics": got.data.metrics, "unsupported": unsupported}))
""")

READ_TAGS = textwrap.dedent("""
    import json, sys
    from mlflow import MlflowClient

    print(json.dumps(MlflowClient().get_run(sys.argv[1]).data.tags))
""")


def _mlflow(script: str, url: str, token: str, *args: str) -> dict:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
           "MLFLOW_TRACKING_URI": url + "/mlflow", "MLFLOW_TRACKING_TOKEN": token,
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))


def test_set_experiment_finds_only_the_callers_own_study_of_that_name(live_server):
    first = _mlflow(SET_EXPERIMENT, live_server.url, live_server.tokens["user"], "shared-name")
    again = _mlflow(SET_EXPERIMENT, live_server.url, live_server.tokens["user"], "shared-name")
    assert again["experiment_id"] == first["experiment_id"]  # the owner finds theirs
    other_user = live_server.new_tokens()["user"]
    other = _mlflow(SET_EXPERIMENT, live_server.url, other_user, "shared-name")  # was: 403 at start_run
    assert other["experiment_id"] != first["experiment_id"]
    http = live_server.client()
    for out in (first, other):
        study = http.get(f"/api/v1/studies/{out['experiment_id']}").json()
        assert study["name"] == "shared-name" and study["spec"]["kind"] == "external"
        assert http.get(f"/api/v1/runs/{out['run_id']}").json()["status"] == "completed"


def test_client_calls_of_the_support_table(live_server):
    experiment = _mlflow(SET_EXPERIMENT, live_server.url, live_server.tokens["user"], "client-calls")
    out = _mlflow(CLIENT_CALLS, live_server.url, live_server.tokens["user"], experiment["experiment_id"])
    assert out["name"] == "client-calls" and out["experiment_id"] == experiment["experiment_id"]
    assert out["run_experiment"] == experiment["experiment_id"] and out["run_id"] != experiment["run_id"]
    assert out["tags"]["team"] == "vision" and out["tags"]["stage"] == "warmup"
    assert out["tags"]["mlflow.runName"] == "made-by-client"
    assert out["metrics"] == {"loss": 0.25}
    assert out["unsupported"]["error_code"] == "NOT_IMPLEMENTED"
    assert "runs/delete-tag is not supported" in out["unsupported"]["message"]
    assert "docs/mlflow.md" in out["unsupported"]["message"]
    http = live_server.client()
    run = http.get(f"/api/v1/runs/{out['run_id']}").json()
    assert run["status"] == "completed" and run["study_id"] == int(experiment["experiment_id"])
    stored = _mlflow(READ_TAGS, live_server.url, live_server.tokens["user"], out["run_id"])  # another process
    assert stored["team"] == "vision" and stored["stage"] == "warmup"

QUICKSTART = textwrap.dedent("""
    import json, sys, time
    import mlflow

    mlflow.set_experiment(sys.argv[1])
    with mlflow.start_run() as run:
        for loss in (0.9, 0.5, 0.3):  # once per epoch, without step=: every value at step 0
            mlflow.log_metric("loss", loss)
            time.sleep(0.01)  # an epoch takes longer: each call gets its own timestamp
        during = mlflow.MlflowClient().get_run(run.info.run_id).data.metrics
    after = mlflow.MlflowClient().get_run(run.info.run_id).data.metrics
    print(json.dumps({"run_id": run.info.run_id, "during": during, "after": after}))
""")


def test_the_quickstart_style_is_judged_on_its_last_epoch(live_server):
    """mlflow.log_metric once per epoch without step=: MLflow keeps every value at step 0 and get_run answers the
    latest; Steady reads the step's latest too, as the run's final value and in get_run."""
    out = _mlflow(QUICKSTART, live_server.url, live_server.tokens["user"], "quickstart-epochs")
    assert out["during"] == {"loss": 0.3} and out["after"] == {"loss": 0.3}
    http = live_server.client()
    run = http.get(f"/api/v1/runs/{out['run_id']}").json()
    assert run["status"] == "completed" and run["final_metrics"] == {"loss": 0.3}
    assert run["metric_conflicts"] is None
    got = http.get(f"/api/v1/runs/{out['run_id']}/metrics/loss").json()
    assert got["steps"] == [0] and got["values"] == [0.3]
