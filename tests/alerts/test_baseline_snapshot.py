"""A suite baseline is a frozen snapshot: changing its study's runs afterwards changes no comparison."""

from __future__ import annotations

import hashlib
import json
import zlib

import numpy as np
import pytest

from steady.server.alerts import baselines
from steady.server.models import BaselineSnapshot
from tests.alerts.conftest import external_study


@pytest.fixture
def alert_api(make_api, fast_alerts):
    return make_api(allow_private_webhooks=True)


def _details(api, sid: int) -> dict:
    r = api.post(f"/api/v1/studies/{sid}/evaluate")
    assert r.status_code == 200, r.text
    alerts = api.get("/api/v1/alerts", params={"suite": "s"}).json()["items"]
    return {(a["kind"], a["details"].get("mode")): a["details"] for a in alerts}


def test_comparisons_read_the_snapshot_and_moving_it_records_a_version(alert_api):
    api = alert_api
    rng = np.random.default_rng(11)
    base = external_study(api.post, suite="s", finals=(1.0 + 0.01 * rng.standard_normal(8)).tolist())
    for rule in ({"kind": "out_of_baseline", "metric": "loss"},
                 {"kind": "not_equivalent", "metric": "loss", "margin": 0.05}):
        assert api.post("/api/v1/alert-rules", json={**rule, "suite": "s"}).status_code == 201
    r = api.client.put("/api/v1/suites/s/baseline", headers=api.h(), json={"study_id": base, "reason": "first"})
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["version"] == 1 and first["n_runs"] == 8 and len(first["digest"]) == 64 and first["set_by"]
    assert api.get("/api/v1/suites/s/baseline").json()["digest"] == first["digest"]

    # the digest is the SHA-256 of the stored canonical JSON, which holds every value exactly
    with api.app.state.database.read() as s:
        snap = s.get(BaselineSnapshot, 1)
        raw = zlib.decompress(snap.body)
    assert hashlib.sha256(raw).hexdigest() == first["digest"]
    doc = json.loads(raw)
    assert baselines.canonical(doc) == raw and len(doc["runs"]) == 8
    assert {r["seed"] for r in doc["runs"]} == set(range(8)) and all("loss" in r["final"] for r in doc["runs"])
    decoded = baselines.runs_of(doc, "loss")
    assert [float(r.series["loss"][1][-1]) for r in decoded] == [r["final"]["loss"] for r in doc["runs"]]
    assert all(r.stack == "baseline" and len(r.series["loss"][0]) == 10 for r in decoded)

    shifted = external_study(api.post, suite="s", finals=(1.2 + 0.01 * rng.standard_normal(8)).tolist())
    before = _details(api, shifted)
    compare = api.get("/api/v1/suites/s/baseline/compare", params={"study_id": shifted}).json()
    assert compare["baseline_digest"] == first["digest"]

    # change the baseline study's rows: exclude two runs, add a far-off one
    runs = api.get(f"/api/v1/studies/{base}/runs").json()["items"]
    for run in runs[:2]:
        assert api.post(f"/api/v1/runs/{run['id']}/exclude", json={"reason": "bad node"}).status_code == 200
    r = api.post(f"/api/v1/studies/{base}/runs", json={
        "seed": 99, "determinism": "seeded", "stack": {"name": "a100"},
        "metrics": {"loss": {"steps": list(range(10)), "values": [5.0] * 10}}})
    assert r.status_code == 201, r.text

    after = _details(api, shifted)
    for key in (("out_of_baseline", "final"), ("not_equivalent", None)):
        for field in ("interval", "n_baseline", "outside", "margin", "tost_p_adjusted", "n_reference"):
            assert after[key].get(field) == before[key].get(field), (key, field)
    assert after[("out_of_baseline", "final")]["n_baseline"] == 8
    assert api.get("/api/v1/suites/s/baseline/compare", params={"study_id": shifted}).json() == compare
    assert api.get("/api/v1/suites/s/baseline").json()["digest"] == first["digest"]

    # moving the baseline is an explicit act: a new version with who and why, the old one kept
    r = api.client.put("/api/v1/suites/s/baseline", headers=api.h(), json={"study_id": base, "reason": "rebased"})
    second = r.json()
    assert second["version"] == 2 and second["n_runs"] == 7 and second["digest"] != first["digest"]
    history = api.get("/api/v1/suites/s/baseline/history").json()["items"]
    assert [(h["version"], h["digest"], h["reason"]) for h in history] == [
        (2, second["digest"], "rebased"), (1, first["digest"], "first")]
    assert all(h["created_by"] for h in history)
    assert _details(api, shifted)[("out_of_baseline", "final")]["n_baseline"] == 7

    # the same content snapshots to the same digest
    r = api.client.put("/api/v1/suites/s/baseline", headers=api.h(), json={"study_id": base})
    assert r.json()["version"] == 3 and r.json()["digest"] == second["digest"]


def test_baseline_routes_refuse_bad_input_with_422(alert_api):
    api = alert_api
    assert api.get("/api/v1/suites/none/baseline/history").status_code == 404
    base = external_study(api.post, suite="s", finals=[1.0, 1.01, 0.99])
    r = api.client.put("/api/v1/suites/s/baseline", headers=api.h(), json={"study_id": base, "reason": "x" * 3000})
    assert r.status_code == 422 and "reason" in r.text
    assert api.client.put("/api/v1/suites/s/baseline", headers=api.h(), json={"study_id": base}).status_code == 200
    r = api.get("/api/v1/suites/s/baseline/compare", params={"study_id": 0})
    assert r.status_code == 422 and "study_id" in r.text
    r = api.get("/api/v1/suites/s/baseline/compare", params={"study_id": 999})
    assert r.status_code == 422 and "does not exist" in r.text


def test_a_baseline_from_before_snapshots_reads_the_live_runs_until_moved(alert_api):
    api = alert_api
    base = external_study(api.post, suite="s", finals=[1.0, 1.01, 0.99, 1.02, 0.98])
    assert api.client.put("/api/v1/suites/s/baseline", headers=api.h(), json={"study_id": base}).status_code == 200
    from steady.server.models import SuiteBaseline

    with api.app.state.database.write() as s:  # as migration 0008 leaves a baseline set before it
        s.get(SuiteBaseline, "s").snapshot_id = None
    legacy = api.get("/api/v1/suites/s/baseline").json()
    assert legacy["study_id"] == base and legacy["digest"] is None and legacy["version"] is None
    with api.app.state.database.read() as s:
        assert len(baselines.baseline_runs(s, s.get(SuiteBaseline, "s"), "loss")) == 5
    r = api.client.put("/api/v1/suites/s/baseline", headers=api.h(), json={"study_id": base, "reason": "freeze"})
    assert r.json()["version"] == 2 and r.json()["digest"]


def test_clearing_a_baseline_is_a_recorded_version_and_a_running_study_cannot_be_frozen(alert_api):
    from tests.api.helpers import lease, register, spec

    api = alert_api
    base = external_study(api.post, suite="s", finals=[1.0, 1.01, 0.99, 1.02])
    first = api.client.put("/api/v1/suites/s/baseline", headers=api.h(), json={"study_id": base, "reason": "v1"}).json()
    r = api.client.delete("/api/v1/suites/s/baseline", headers=api.h(), params={"reason": "the cluster was rebuilt"})
    assert r.status_code == 204, r.text
    assert api.get("/api/v1/suites/s/baseline").status_code == 404
    assert api.get("/api/v1/suites/s/baseline/compare", params={"study_id": base}).status_code == 404
    history = api.get("/api/v1/suites/s/baseline/history").json()["items"]
    cleared, kept = history
    assert (cleared["version"], cleared["action"], cleared["reason"], cleared["digest"]) == (
        2, "cleared", "the cluster was rebuilt", None)
    assert cleared["created_by"] and cleared["created_at"] >= kept["created_at"] and cleared["study_id"] == base
    assert (kept["version"], kept["action"], kept["digest"]) == (1, "set", first["digest"])
    assert api.client.delete("/api/v1/suites/s/baseline", headers=api.h()).status_code == 404  # nothing to clear
    r = api.client.delete("/api/v1/suites/s/baseline", headers=api.h(), params={"reason": "x" * 3000})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "reason"]
    again = api.client.put("/api/v1/suites/s/baseline", headers=api.h(), json={"study_id": base}).json()
    assert again["version"] == 3 and again["digest"] == first["digest"]  # the same content, the same digest

    # a managed study still queued, then running, has not measured its baseline yet: refused, field named
    sid = api.post("/api/v1/studies", json=spec(seeds=[0, 1], repeats=1, determinism=["seeded"], suite="s")).json()["id"]
    for expected in ("queued", "running"):
        assert api.get(f"/api/v1/studies/{sid}").json()["status"] == expected
        r = api.client.put("/api/v1/suites/s/baseline", headers=api.h(), json={"study_id": sid, "reason": "early"})
        assert r.status_code == 409, r.text
        (d,) = r.json()["detail"]
        assert d["loc"] == ["body", "study_id"] and f"study {sid} is {expected}" in d["msg"]
        assert lease(api, register(api)) is not None
    assert api.get("/api/v1/suites/s/baseline").json()["version"] == 3  # nothing was recorded
    assert api.get("/api/v1/suites/s/baseline/history").json()["total"] == 3
