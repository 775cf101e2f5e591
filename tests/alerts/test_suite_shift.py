"""A suite's history of a final metric, watched for a shift across studies."""

from __future__ import annotations

import numpy as np
import pytest

from tests.alerts.conftest import external_study


@pytest.mark.parametrize("planted", [True, False])
def test_shift_alert_fires_at_the_right_study(make_api, planted):
    api = make_api()
    rule = {"kind": "suite_shift", "metric": "loss", "suite": "nightly", "alpha": 0.01, "min_history": 6}
    assert api.post("/api/v1/alert-rules", json=rule).status_code == 201
    rng = np.random.default_rng(42)
    ids = []
    for i in range(10):
        level = 1.3 if planted and i >= 6 else 1.0
        finals = (level + 0.02 * rng.standard_normal(3)).tolist()
        ids.append(external_study(api.post, name=f"night {i}", suite="nightly", finals=finals))
        assert api.post(f"/api/v1/studies/{ids[-1]}/evaluate").status_code == 200
    alerts = api.get("/api/v1/alerts", params={"suite": "nightly"}).json()["items"]
    if not planted:
        assert alerts == []
        return
    (alert,) = alerts
    assert alert["state"] == "firing" and alert["kind"] == "suite_shift" and alert["fire_count"] == 1
    assert alert["study_id"] == ids[6] and alert["link"].endswith(f"/studies/{ids[6]}")
    d = alert["details"]
    assert d["index"] == 6 and d["statistic"] > d["threshold"] and d["mean_after"] > d["mean_before"]
    assert d["guarantee"].startswith("false alarm ≤ 1% over 100 studies")
    assert "AR(1)-correlated up to 0.5" in d["guarantee"]
    # 10 studies are too few to estimate how dependent consecutive studies are: the alert says so
    assert d["dependence"] == "independent" and d["ar_coefficient"] is None and d["too_dependent"] is False
    assert "too short to estimate the dependence between consecutive studies" in alert["summary"]
    assert [h["study_id"] for h in d["history"]] == ids
    # accepting the new level: the baseline moves to the first shifted study, the history restarts there
    r = api.client.put("/api/v1/suites/nightly/baseline", headers=api.h(), json={"study_id": ids[6]})
    assert r.status_code == 200
    ev = api.post(f"/api/v1/studies/{ids[-1]}/evaluate").json()
    assert [a["id"] for a in ev["resolved"]] == [alert["id"]]


def _add_runs(api, sid: int, finals, *, stack: str, determinism: str = "seeded", steps: int = 10) -> None:
    for seed, final in enumerate(finals, start=100):
        curve = (final + np.exp(-np.arange(steps) / 3.0)).tolist()
        curve[-1] = float(final)
        run = {"seed": seed, "determinism": determinism, "stack": {"name": stack},
               "metrics": {"loss": {"steps": list(range(steps)), "values": curve}}}
        r = api.post(f"/api/v1/studies/{sid}/runs", json=run)
        assert r.status_code == 201, r.text


def test_a_change_of_composition_is_not_a_shift(make_api):
    """A second stack at another level joins the suite: pooled, the study mean jumps; per stack it does not."""
    api = make_api()
    rule = {"kind": "suite_shift", "metric": "loss", "suite": "mixed", "min_history": 4}
    assert api.post("/api/v1/alert-rules", json=rule).status_code == 201
    rng = np.random.default_rng(8)
    for i in range(12):
        sid = external_study(api.post, name=f"m{i}", suite="mixed", stack="a100",
                             finals=(1.0 + 0.02 * rng.standard_normal(3)).tolist())
        if i >= 6:  # from study 6 on, h100 runs at a level 0.5 higher join the same studies
            _add_runs(api, sid, (1.5 + 0.02 * rng.standard_normal(3)).tolist(), stack="h100")
        ev = api.post(f"/api/v1/studies/{sid}/evaluate")
        assert ev.status_code == 200, ev.text
        assert ev.json()["firing"] == [], ev.json()["firing"]
    assert api.get("/api/v1/alerts", params={"suite": "mixed"}).json()["items"] == []
    # the same h100 history, now shifted: its own group fires, a100 stays quiet
    for i in range(12, 18):
        sid = external_study(api.post, name=f"m{i}", suite="mixed", stack="a100",
                             finals=(1.0 + 0.02 * rng.standard_normal(3)).tolist())
        _add_runs(api, sid, (2.5 + 0.02 * rng.standard_normal(3)).tolist(), stack="h100")
        assert api.post(f"/api/v1/studies/{sid}/evaluate").status_code == 200
    (alert,) = api.get("/api/v1/alerts", params={"suite": "mixed"}).json()["items"]
    assert alert["group"] == {"suite": "mixed", "stack": "h100", "determinism": "seeded"}
    assert alert["details"]["mean_after"] > alert["details"]["mean_before"]
