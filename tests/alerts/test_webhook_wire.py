"""Alert details and webhook bodies spell non-finite values as the API does ("NaN", "Infinity",
"-Infinity"; steady.server.kit.wire), in strict JSON."""

from __future__ import annotations

import json

import numpy as np

from tests.alerts.conftest import external_study
from tests.api.helpers import bare_constant, strict


def test_alert_details_and_webhook_payload_spell_non_finite_values(make_api, fast_alerts, receiver):
    api = make_api(allow_private_webhooks=True)
    assert api.post("/api/v1/webhooks", role="admin", json={"url": receiver.url, "name": "t"}).status_code == 201
    rng = np.random.default_rng(3)
    base = external_study(api.post, suite="s", finals=(1.0 + 0.01 * rng.standard_normal(6)).tolist())
    assert api.post("/api/v1/alert-rules", json={"kind": "out_of_baseline", "metric": "loss", "suite": "s"}).status_code == 201
    r = api.client.put("/api/v1/suites/s/baseline", headers=api.h(), json={"study_id": base, "stack": "a100"})
    assert r.status_code == 200, r.text
    # a candidate whose seed 0 diverged: it has no value at the shared final step
    cand = external_study(api.post, suite="s", finals=[1.0, 1.01, 0.99, 1.0], nan_at=9)
    ev = strict(api.post(f"/api/v1/studies/{cand}/evaluate"))
    (alert,) = [a for a in ev["firing"] if a["kind"] == "out_of_baseline"]
    assert {o["seed"]: o["final"] for o in alert["details"]["outside"]} == {0: "NaN"}
    (msg,) = receiver.wait_for(1)
    payload = json.loads(msg["raw"], parse_constant=bare_constant)
    assert payload["alert"]["details"]["outside"] == alert["details"]["outside"]
    listed = strict(api.get(f"/api/v1/alerts/{alert['id']}"))
    assert listed["details"]["outside"][0]["final"] == "NaN"
