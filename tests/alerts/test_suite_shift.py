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
    assert [h["study_id"] for h in d["history"]] == ids
    # accepting the new level: the baseline moves to the first shifted study, the history restarts there
    r = api.client.put("/api/v1/suites/nightly/baseline", headers=api.h(), json={"study_id": ids[6]})
    assert r.status_code == 200
    ev = api.post(f"/api/v1/studies/{ids[-1]}/evaluate").json()
    assert [a["id"] for a in ev["resolved"]] == [alert["id"]]
