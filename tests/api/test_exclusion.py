"""Excluding a run with bad data: recorded (who, when, why), shown, and never judged."""

from __future__ import annotations

import numpy as np


def _study_with_a_poisoned_run(api) -> tuple[int, int]:
    sid = api.post("/api/v1/studies", json={"name": "imported", "kind": "external", "metrics": ["loss"]}).json()["id"]
    rng = np.random.default_rng(7)
    steps = list(range(20))
    ids = []
    for seed in range(10):
        values = (1.0 / (1 + np.arange(20)) + rng.normal(0, 0.001, 20)).tolist()
        if seed == 9:
            values = [v + 1e6 for v in values]  # a run with bad data
        run = {"seed": seed, "determinism": "seeded", "stack": {"name": "a100"},
               "metrics": {"loss": {"steps": steps, "values": values}}}
        r = api.post(f"/api/v1/studies/{sid}/runs", json=run)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    return sid, ids[-1]


def _band_max(api, sid: int) -> float:
    groups = api.get(f"/api/v1/studies/{sid}/bands", params={"metric": "loss"}).json()["groups"]
    (g,) = groups
    return max(v for v in g["max"] if isinstance(v, float))


def test_excluded_run_is_recorded_listed_and_not_judged(api):
    sid, bad = _study_with_a_poisoned_run(api)
    assert _band_max(api, sid) > 1e5
    before = api.get(f"/api/v1/studies/{sid}/report").json()
    assert before["n_runs_judged"] == 10 and before["excluded_runs"] == []

    r = api.post(f"/api/v1/runs/{bad}/exclude", json={"reason": "loss logged in the wrong units"})
    assert r.status_code == 200, r.text
    run = r.json()
    assert run["excluded_reason"] == "loss logged in the wrong units"
    assert run["excluded_by"].startswith("test-user") and run["excluded_at"]

    report = api.get(f"/api/v1/studies/{sid}/report").json()
    assert report["n_runs_judged"] == 9
    (entry,) = report["excluded_runs"]
    assert entry["run_id"] == bad and entry["reason"] == "loss logged in the wrong units"
    assert entry["excluded_by"].startswith("test-user")
    assert _band_max(api, sid) < 2
    # the run is still stored and listed, marked
    runs = api.get(f"/api/v1/studies/{sid}/runs").json()["items"]
    assert len(runs) == 10 and [r["id"] for r in runs if r["excluded_at"]] == [bad]
    # the dashboard shows it marked, on the study and on the run
    page = api.client.get(f"/studies/{sid}", headers=api.h())
    assert page.status_code == 200 and "Excluded runs" in page.text and "loss logged in the wrong units" in page.text
    page = api.client.get(f"/runs/{bad}", headers=api.h())
    assert page.status_code == 200 and "data-excluded" in page.text

    # undo: judged again
    assert api.delete(f"/api/v1/runs/{bad}/exclude").status_code == 200
    assert api.get(f"/api/v1/studies/{sid}/report").json()["n_runs_judged"] == 10
    assert api.delete(f"/api/v1/runs/{bad}/exclude").status_code == 409


def test_alerts_skip_excluded_runs(api):
    sid, bad = _study_with_a_poisoned_run(api)
    rule = api.post("/api/v1/alert-rules", json={"kind": "band_width", "metric": "loss", "max": 10.0, "study_id": sid})
    assert rule.status_code == 201, rule.text
    first = api.post(f"/api/v1/studies/{sid}/evaluate").json()
    assert len(first["firing"]) == 1, first
    assert api.post(f"/api/v1/runs/{bad}/exclude", json={"reason": "bad data"}).status_code == 200
    second = api.post(f"/api/v1/studies/{sid}/evaluate").json()
    assert second["firing"] == [] and len(second["resolved"]) == 1, second


def test_exclusion_needs_a_reason_and_a_run(api):
    _, bad = _study_with_a_poisoned_run(api)
    r = api.post(f"/api/v1/runs/{bad}/exclude", json={})
    assert r.status_code == 422 and "reason" in r.text
    r = api.post(f"/api/v1/runs/{bad}/exclude", json={"reason": ""})
    assert r.status_code == 422 and "reason" in r.text
    assert api.post("/api/v1/runs/999999/exclude", json={"reason": "x"}).status_code == 404
