"""The worker side of the protocol, driven by a test client standing in for the worker."""

from __future__ import annotations

import math

import numpy as np

from tests.api.helpers import batch, error_msg, lease, register, result, spec


def _one_run_study(api, **kw):
    return api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["strict"], **kw)).json()["id"]


def test_full_run_lifecycle(api):
    sid = _one_run_study(api)
    wid = register(api)
    leased = lease(api, wid)
    assert leased["spec"]["workload"] == "torch_mlp" and leased["spec"]["determinism"] == "strict"
    assert leased["attempt"] == 1
    assert api.get(f"/api/v1/studies/{sid}").json()["status"] == "running"
    run_id, lid = leased["run_id"], leased["lease_id"]
    r = api.post(f"/api/v1/runs/{run_id}/heartbeat", role="worker", json={"lease_id": lid, "step": 3})
    assert r.status_code == 200 and r.json()["cancel"] is False
    assert api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=batch(lid, 0, "loss", [0, 1], [1.0, 0.5])).status_code == 200
    r = api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid))
    assert r.status_code == 200 and r.json()["status"] == "completed"
    study = api.get(f"/api/v1/studies/{sid}").json()
    assert study["status"] == "completed" and study["finished_at"]
    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["digests"]["initial_weights"] == "a" * 64 and run["metric_keys"] == ["loss"]
    # completing twice is answered clearly and changes nothing
    again = api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid, final_metrics={"loss": 9.0}))
    assert again.status_code == 409 and "already completed" in error_msg(again)
    assert api.get(f"/api/v1/runs/{run_id}").json()["final_metrics"] == {"loss": 0.5}


def test_series_roundtrip_is_bitwise_with_nonfinite(api):
    _one_run_study(api)
    leased = lease(api, register(api))
    rng = np.random.default_rng(7)
    values = rng.standard_normal(1000)
    values[[3, 10, 11]] = [math.nan, math.inf, -math.inf]
    values[20] = 5e-324  # subnormal
    values[21] = -0.0
    steps = list(range(1000))
    lid, run_id = leased["lease_id"], leased["run_id"]
    # two batches; the JSON-list encoding for one of them
    first = batch(lid, 0, "loss", steps[:500], values[:500].tolist())
    assert api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=first).status_code == 200
    plain = {"lease_id": lid, "seq": 1, "series": [{"key": "loss", "steps": steps[500:], "values": values[500:].tolist()}]}
    import json

    body = json.dumps(plain)  # Python writes NaN/Infinity literals
    headers = {**api.h("worker"), "content-type": "application/json"}
    assert api.client.post(f"/api/v1/runs/{run_id}/metrics", content=body, headers=headers).status_code == 200
    packed = api.get(f"/api/v1/runs/{run_id}/metrics/loss", params={"format": "packed"}).json()
    import base64

    got = np.frombuffer(base64.b64decode(packed["values_b64"]), "<f8")
    assert got.tobytes() == values.astype("<f8").tobytes()
    listed = api.get(f"/api/v1/runs/{run_id}/metrics/loss").json()
    assert listed["steps"] == steps and listed["values"][3] == "NaN" and listed["values"][10] == "Infinity"
    assert listed["values"][11] == "-Infinity" and listed["values"][0] == values[0]
    assert api.get(f"/api/v1/runs/{run_id}/metrics/nope").status_code == 404


def test_retried_batch_is_not_stored_twice(api):
    _one_run_study(api)
    leased = lease(api, register(api))
    lid, run_id = leased["lease_id"], leased["run_id"]
    body = batch(lid, 5, "loss", [0, 1, 2], [3.0, 2.0, 1.0])
    first = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=body).json()
    second = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=body).json()
    assert first["duplicate"] is False and second["duplicate"] is True
    assert api.get(f"/api/v1/runs/{run_id}/metrics/loss").json()["n"] == 3


def test_oversize_batch_is_413(make_api):
    api = make_api(max_batch_points=100)
    _one_run_study(api)
    leased = lease(api, register(api))
    r = api.post(f"/api/v1/runs/{leased['run_id']}/metrics", role="worker",
                 json=batch(leased["lease_id"], 0, "loss", list(range(101)), [0.0] * 101))
    assert r.status_code == 413 and "limit of 100 points" in error_msg(r)


def test_oversize_body_is_413(make_api):
    api = make_api(max_body_bytes=4096)
    r = api.post("/api/v1/studies", json=spec(description="x" * 5000))
    assert r.status_code == 413 and "STEADY_MAX_BODY_BYTES" in error_msg(r)


def test_bad_batches(api):
    _one_run_study(api)
    leased = lease(api, register(api))
    url = f"/api/v1/runs/{leased['run_id']}/metrics"
    lid = leased["lease_id"]
    bad = [
        {"lease_id": lid, "seq": 0, "series": [{"key": "loss", "steps": [1, 2], "values": [1.0]}]},
        {"lease_id": lid, "seq": -1, "series": [{"key": "loss", "steps": [1], "values": [1.0]}]},
        {"lease_id": lid, "seq": 0, "series": []},
        {"lease_id": lid, "seq": 0, "series": [{"key": "bad key!", "steps": [1], "values": [1.0]}]},
        {"lease_id": lid, "seq": 0, "series": [{"key": "loss", "steps_b64": "!!!", "values_b64": "AAAA"}]},
        {"lease_id": lid, "seq": 0, "series": [{"key": "loss", "steps": ["a"], "values": [1.0]}]},
        # a key twice in one batch was acknowledged as a duplicate with nothing stored
        {"lease_id": lid, "seq": 0, "series": [{"key": "loss", "steps": [1], "values": [1.0]},
                                               {"key": "loss", "steps": [2], "values": [2.0]}]},
    ]
    for body in bad:
        r = api.post(url, role="worker", json=body)
        assert r.status_code == 422, (body, r.text)
    assert "appears twice" in api.post(url, role="worker", json=bad[-1]).text
    r = api.post("/api/v1/runs/424242/metrics", role="worker", json=batch(lid, 0, "loss", [1], [1.0]))
    assert r.status_code == 404


def test_expired_lease_requeued_and_late_worker_refused(make_api, clock):
    api = make_api(lease_seconds=30)
    sid = _one_run_study(api, max_attempts=3)
    w1, w2 = register(api, "w1"), register(api, "w2")
    first = lease(api, w1)
    run_id = first["run_id"]
    api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=batch(first["lease_id"], 0, "loss", [0, 1], [9.0, 9.0]))
    # the run's own MLflow client logs step 1 again: a history, whose latest value the series reads
    relog = api.client.post("/mlflow/api/2.0/mlflow/runs/log-metric", headers={"Authorization": f"Bearer {first['run_token']}"},
                            json={"run_id": str(run_id), "key": "loss", "value": 8.0, "step": 1, "timestamp": 1})
    assert relog.status_code == 200
    assert api.get(f"/api/v1/runs/{run_id}/metrics/loss").json()["values"] == [9.0, 8.0]
    assert lease(api, w2) is None  # the lease still holds
    clock.advance(31)
    second = lease(api, w2)  # leasing reaps the expired run first
    assert second["run_id"] == run_id and second["attempt"] == 2
    assert api.get(f"/api/v1/runs/{run_id}/metrics/loss").status_code == 404  # the first attempt's points, gone with it
    # the first worker is late: heartbeat, metrics and completion are all refused
    for path, body in (
        ("heartbeat", {"lease_id": first["lease_id"]}),
        ("metrics", batch(first["lease_id"], 1, "loss", [2], [9.0])),
        ("complete", result(first["lease_id"])),
    ):
        r = api.post(f"/api/v1/runs/{run_id}/{path}", role="worker", json=body)
        assert r.status_code == 409 and "lease" in error_msg(r), (path, r.text)
    lid = second["lease_id"]
    api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=batch(lid, 0, "loss", [0, 1, 2], [1.0, 0.5, 0.25]))
    assert api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid)).status_code == 200
    series = api.get(f"/api/v1/runs/{run_id}/metrics/loss").json()
    assert series["steps"] == [0, 1, 2] and series["values"] == [1.0, 0.5, 0.25]
    assert api.get(f"/api/v1/studies/{sid}").json()["status"] == "completed"


def test_attempts_exhausted_fails_run(make_api, clock):
    api = make_api(lease_seconds=30)
    sid = _one_run_study(api, max_attempts=1)
    wid = register(api)
    lease(api, wid)
    clock.advance(31)
    assert lease(api, wid) is None
    run = api.get(f"/api/v1/studies/{sid}/runs").json()["items"][0]
    assert run["status"] == "failed" and "lease expired" in run["error"] and run["attempt"] == 1
    assert api.get(f"/api/v1/studies/{sid}").json()["status"] == "failed"


def test_release_puts_run_back_without_counting(api):
    _one_run_study(api)
    wid = register(api)
    first = lease(api, wid)
    api.post(f"/api/v1/runs/{first['run_id']}/metrics", role="worker", json=batch(first["lease_id"], 0, "loss", [0], [1.0]))
    r = api.post(f"/api/v1/runs/{first['run_id']}/release", role="worker", json={"lease_id": first["lease_id"]})
    assert r.json()["status"] == "queued"
    again = lease(api, wid)
    assert again["run_id"] == first["run_id"] and again["attempt"] == 1
    assert api.get(f"/api/v1/runs/{first['run_id']}/metrics/loss").status_code == 404


def test_labels_select_runs(api):
    api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["seeded"],
                                          stacks=[{"name": "gpu", "labels": ["cuda-12.4"]}]))
    cpu = register(api, "cpu-box", ("torch", "cpu"))
    assert lease(api, cpu) is None
    gpu = register(api, "gpu-box", ("torch", "cuda-12.4"))
    assert lease(api, gpu)["spec"]["stack"] == "gpu"
    tf_only = register(api, "tf-box", ("tensorflow", "cuda-12.4"))
    assert lease(api, tf_only) is None


def test_a_python_study_is_leased_by_a_worker_without_any_framework(api):
    """``framework: python`` code needs no ML framework: a box with neither torch nor TensorFlow runs it
    (every worker labels itself ``python``), and a torch box without that label (an older agent) does not."""
    body = spec(seeds=[0], repeats=1, determinism=["seeded"],
                workload={"framework": "python", "command": ["python", "train.py", "--seed", "{seed}"]})
    assert api.post("/api/v1/studies", json=body).status_code == 201
    assert lease(api, register(api, "old-torch-box", ("torch", "cpu"))) is None
    leased = lease(api, register(api, "bare-box", ("python", "cpu")))
    assert leased["spec"]["framework"] == "python" and leased["spec"]["command"][1] == "train.py"


def test_user_failure_is_recorded(api):
    sid = _one_run_study(api)
    leased = lease(api, register(api))
    r = api.post(f"/api/v1/runs/{leased['run_id']}/fail", role="worker",
                 json={"lease_id": leased["lease_id"], "kind": "error", "error": "ValueError: boom", "stderr_tail": "Traceback…"})
    assert r.json()["status"] == "failed"
    run = api.get(f"/api/v1/runs/{leased['run_id']}").json()
    assert run["error"] == "ValueError: boom" and run["stderr_tail"] == "Traceback…" and run["failure_kind"] == "error"
    assert api.get(f"/api/v1/studies/{sid}").json()["status"] == "failed"


def test_failure_report_with_nul_bytes_is_stored_on_both_backends(api):
    """PostgreSQL refused NUL in text with a misleading 422 and the real error was lost."""
    _one_run_study(api)
    leased = lease(api, register(api))
    r = api.post(f"/api/v1/runs/{leased['run_id']}/fail", role="worker",
                 json={"lease_id": leased["lease_id"], "kind": "error", "error": "bad\x00byte",
                       "stderr_tail": "tail\x00", "fingerprint": {"k\x00": ["v\x00"]}})
    assert r.status_code == 200, r.text
    run = api.get(f"/api/v1/runs/{leased['run_id']}").json()
    assert run["error"] == "bad\ufffdbyte" and run["stderr_tail"] == "tail\ufffd"


def test_external_study_upload(api):
    r = api.post("/api/v1/studies", json={"name": "imported", "kind": "external", "metrics": ["acc"]})
    assert r.status_code == 201 and r.json()["status"] == "open"
    sid = r.json()["id"]
    run = {"seed": 3, "determinism": "seeded", "stack": {"name": "a100-cu121", "torch": "2.3"},
           "metrics": {"acc": {"steps": [0, 10], "values": [0.1, 0.9]}}, "step_times": [0.1, 0.2]}
    r = api.post(f"/api/v1/studies/{sid}/runs", json=run)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["stack"] == "a100-cu121" and body["final_metrics"] == {"acc": 0.9} and body["status"] == "completed"
    assert api.get(f"/api/v1/runs/{body['id']}/metrics/acc").json()["values"] == [0.1, 0.9]
    assert api.get(f"/api/v1/runs/{body['id']}/metrics/step_time").json()["n"] == 2
    bad = api.post(f"/api/v1/studies/{sid}/runs", json={**run, "metrics": {"acc": {"steps": [0], "values": []}}})
    assert bad.status_code == 422
    managed = api.post("/api/v1/studies", json=spec()).json()["id"]
    assert api.post(f"/api/v1/studies/{managed}/runs", json=run).status_code == 409


def test_builtin_only_worker_never_leases_user_code(api):
    user_code = api.post("/api/v1/studies", json=spec(
        name="byoc", seeds=[0], repeats=1, determinism=["none"],
        workload={"framework": "torch", "entrypoint": "train.py"})).json()["id"]
    builtin = _one_run_study(api)
    wid = register(api)
    r = api.post(f"/api/v1/workers/{wid}/lease", role="worker", json={"worker_id": wid, "builtin_only": True})
    assert r.status_code == 200 and r.json()["study_id"] == builtin and r.json()["spec"]["workload"] == "torch_mlp"
    assert "run_token" not in r.json()  # not asked for: an older worker's Lease model forbids the field
    r = api.post(f"/api/v1/workers/{wid}/lease", role="worker", json={"worker_id": wid, "builtin_only": True})
    assert r.status_code == 204  # the user-code run stays queued for a worker that runs user code
    taken = lease(api, wid)
    assert taken["study_id"] == user_code and taken["spec"]["entrypoint"] == "train.py"
    assert taken["run_token"].startswith(f"stdr_{taken['run_id']}_")


def _conflict(step: int, kept: float, dropped: float) -> dict:
    return {"key": "loss", "step": step, "kept": {"value": kept, "source": f"stdout line {step}"},
            "dropped": {"value": dropped, "source": f"stdout line {step + 1}"}}


def test_capture_conflicts_are_kept_on_the_run_and_named_in_the_report(api):
    sid = _one_run_study(api)
    leased = lease(api, register(api))
    run_id, lid = leased["run_id"], leased["lease_id"]
    too_many = {"count": 30, "first": [_conflict(s, 1.0, 2.0) for s in range(21)]}
    r = api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid, conflicts=too_many))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "conflicts", "first"]  # bounded
    conflicts = {"count": 30, "first": [_conflict(500, 2.31, 2.295), _conflict(1000, 1.5, "NaN")]}
    assert api.post(f"/api/v1/runs/{run_id}/complete", role="worker",
                    json=result(lid, conflicts=conflicts)).status_code == 200
    assert api.get(f"/api/v1/runs/{run_id}").json()["metric_conflicts"] == conflicts
    (caveat,) = api.get(f"/api/v1/studies/{sid}/report").json()["caveats"]
    assert caveat["kind"] == "capture_conflicts" and caveat["run_id"] == run_id
    assert caveat["message"].startswith(f"run {run_id}: 30 values were logged a second time, differently")
    assert "loss at step 500: kept 2.31 (stdout line 500), not stored 2.295 (stdout line 501)" in caveat["message"]


def test_a_failed_run_keeps_its_capture_conflicts(api):
    _one_run_study(api)
    leased = lease(api, register(api))
    conflicts = {"count": 1, "first": [_conflict(3, 0.5, 0.25)]}
    r = api.post(f"/api/v1/runs/{leased['run_id']}/fail", role="worker",
                 json={"lease_id": leased["lease_id"], "error": "ValueError: boom", "conflicts": conflicts})
    assert r.status_code == 200, r.text
    assert api.get(f"/api/v1/runs/{leased['run_id']}").json()["metric_conflicts"] == conflicts


def test_a_value_sent_again_through_mlflow_is_history_not_a_conflict(api):
    """The MLflow-compatible endpoint is a channel the worker does not see: values an MLflow client logs at a
    step the run holds are a history, as MLflow keeps them (the step reads the latest), the same value again and
    a retried request store nothing, and the worker's own conflicts arrive with the result."""
    _one_run_study(api)
    leased = lease(api, register(api))
    run_id, lid = leased["run_id"], leased["lease_id"]
    h = {"Authorization": f"Bearer {leased['run_token']}"}
    assert api.post(f"/api/v1/runs/{run_id}/metrics", role="worker",
                    json=batch(lid, 0, "loss", [0, 1, 2], [1.0, 0.5, 0.25])).status_code == 200

    def log(step: int, value: float) -> None:
        r = api.client.post("/mlflow/api/2.0/mlflow/runs/log-batch", headers=h, json={
            "run_id": str(run_id), "metrics": [{"key": "loss", "value": value, "step": step, "timestamp": 1}]})
        assert r.status_code == 200, r.text

    log(1, 0.5)  # the same value again: nothing stored
    log(2, 9.0)  # a different one: the step's latest
    log(2, 9.0)  # the client's retry of that request: a no-op
    log(3, 0.125)
    got = api.get(f"/api/v1/runs/{run_id}/metrics/loss").json()
    assert got["steps"] == [0, 1, 2, 3] and got["values"] == [1.0, 0.5, 9.0, 0.125]
    assert api.get(f"/api/v1/runs/{run_id}").json()["metric_conflicts"] is None
    worker_side = {"count": 4, "first": [_conflict(7, 1.0, 2.0)]}
    assert api.post(f"/api/v1/runs/{run_id}/complete", role="worker",
                    json=result(lid, conflicts=worker_side)).status_code == 200
    assert api.get(f"/api/v1/runs/{run_id}").json()["metric_conflicts"] == worker_side
