"""Repeated steps from an MLflow client are a history, as MLflow keeps them: the REST calls MLflow's
quickstart style makes (``mlflow.log_metric("loss", v)`` once per epoch without ``step=``: every value at
step 0, timestamps increasing), in process."""

from __future__ import annotations

import numpy as np

from tests.runs.test_usage_counter import chunk_usage
from steady.server.metrics.repository import _assemble, encode

MLFLOW = "/mlflow/api/2.0/mlflow"
EPOCHS = [(1_700_000_000_000, 0.9), (1_700_000_060_000, 0.5), (1_700_000_120_000, 0.3)]  # (timestamp ms, loss)


def _external_run(api, name: str) -> str:
    exp = api.post(f"{MLFLOW}/experiments/create", json={"name": name})
    assert exp.status_code == 200, exp.text
    run = api.post(f"{MLFLOW}/runs/create", json={"experiment_id": exp.json()["experiment_id"],
                                                   "start_time": EPOCHS[0][0]})
    assert run.status_code == 200, run.text
    return run.json()["run"]["info"]["run_id"]


def _log_metric(api, run_id: str, value: float, timestamp: int, step: int = 0) -> None:
    # what mlflow.log_metric sends without step=: step 0 and the time of the call
    r = api.post(f"{MLFLOW}/runs/log-metric", json={"run_id": run_id, "key": "loss", "value": value,
                                                     "timestamp": timestamp, "step": step})
    assert r.status_code == 200, r.text


def _stored(api, run_id: str) -> tuple[list[int], list[float], int]:
    """The series as it reads, and how many points the run's attempt holds."""
    got = api.get(f"/api/v1/runs/{run_id}/metrics/loss").json()
    with api.app.state.database.write() as session:
        points, _ = chunk_usage(session, int(run_id))  # attempt 1, the run's current
    return got["steps"], got["values"], points


def _latest(api, run_id: str) -> dict:
    r = api.get(f"{MLFLOW}/runs/get", params={"run_id": run_id})
    assert r.status_code == 200, r.text
    return {m["key"]: m for m in r.json()["run"]["data"]["metrics"]}


def test_values_logged_at_one_step_are_a_history_and_the_latest_is_the_final_value(api):
    run_id = _external_run(api, "quickstart-history")
    for i, (ts, loss) in enumerate(EPOCHS):
        _log_metric(api, run_id, loss, ts)
        # as MLflow answers: the latest by (step, timestamp), after every epoch
        latest = _latest(api, run_id)["loss"]
        assert (latest["value"], latest["step"]) == (loss, "0")
        assert _stored(api, run_id) == ([0], [loss], i + 1)  # every value kept; the step reads its latest
    _log_metric(api, run_id, *EPOCHS[1][::-1])  # the client's retry of epoch 1's request: a no-op
    _log_metric(api, run_id, *EPOCHS[2][::-1])  # and of the last one
    assert _stored(api, run_id) == ([0], [0.3], 3)
    assert _latest(api, run_id)["loss"]["value"] == 0.3
    assert api.get(f"/api/v1/runs/{run_id}").json()["metric_conflicts"] is None  # a history, not a conflict
    done = api.post(f"{MLFLOW}/runs/update", json={"run_id": run_id, "status": "FINISHED"})
    assert done.status_code == 200, done.text
    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["final_metrics"] == {"loss": 0.3}  # the run's final value: epoch 2's, not epoch 0's
    assert _latest(api, run_id)["loss"]["value"] == 0.3


def test_one_request_is_stored_in_timestamp_order_and_a_later_step_stays_latest(api):
    run_id = _external_run(api, "batch-history")
    # async logging sends several calls in one log-batch, not necessarily in timestamp order
    metrics = [{"key": "loss", "value": 0.3, "timestamp": 30, "step": 0},
               {"key": "loss", "value": 0.9, "timestamp": 10, "step": 0},
               {"key": "loss", "value": 0.5, "timestamp": 20, "step": 0}]
    r = api.post(f"{MLFLOW}/runs/log-batch", json={"run_id": run_id, "metrics": metrics})
    assert r.status_code == 200, r.text
    assert _stored(api, run_id) == ([0], [0.3], 3)
    _log_metric(api, run_id, 0.7, 40, step=5)
    _log_metric(api, run_id, 0.1, 50, step=0)  # a later timestamp at a lower step: MLflow's latest stays step 5
    steps, values, points = _stored(api, run_id)
    assert (steps, values, points) == ([0, 5], [0.1, 0.7], 5)
    assert (_latest(api, run_id)["loss"]["value"], _latest(api, run_id)["loss"]["step"]) == (0.7, "5")
    done = api.post(f"{MLFLOW}/runs/update", json={"run_id": run_id, "status": "FINISHED"})
    assert done.status_code == 200, done.text
    # a finished run answers the same, its step included (it answered step 0)
    assert (_latest(api, run_id)["loss"]["value"], _latest(api, run_id)["loss"]["step"]) == (0.7, "5")


def test_a_step_reads_the_latest_mlflow_value_and_the_first_of_any_other():
    """The rule ``_assemble`` applies to the chunks of one series (step_min, chunk id, steps, value bytes, seq):
    seq < 0 is a request to the MLflow endpoint, seq >= 0 a batch of the worker's."""
    def chunk(chunk_id: int, seq: int, steps: list[int], values: list[float]):
        s = np.asarray(steps, dtype=np.int64)
        steps_b, values_b = encode(s, np.asarray(values, dtype=np.float64))
        return (min(steps), chunk_id, s, values_b, seq)

    steps, values = _assemble([chunk(1, 0, [0, 1, 2], [1.0, 0.5, 0.25]), chunk(2, 1, [2], [7.0]),
                               chunk(3, -5, [1, 1], [0.4, 0.3]), chunk(4, -9, [1], [0.2])])
    assert steps.tolist() == [0, 1, 2] and values.tolist() == [1.0, 0.2, 0.25]
