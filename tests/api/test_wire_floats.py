"""One JSON spelling of non-finite floats across the API (``steady.server.kit.wire``): "NaN", "Infinity" and
"-Infinity" both ways, null only for "absent", and every response strict JSON.

Metrics with NaN and ±Inf go in through every door (external upload, the worker protocol,
the MLflow-compatible endpoint) and come back out of every route that carries floats."""

from __future__ import annotations

import json
import math

import pytest

from tests.api.helpers import bare_constant as _bare_constant
from tests.api.helpers import lease, register, result, spec, strict
from steady.worker.contract.protocol import MetricBatch, RunResult, Series

SPELLING = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def same(a: float | str, b: float) -> bool:
    """``a`` (a wire value) is the float ``b``, NaN included."""
    x = SPELLING[a] if isinstance(a, str) else a
    return (math.isnan(x) and math.isnan(b)) or x == b


# seed 0 repeat 0 and 1 part at step 1 (NaN against a number); seed 1 ends on NaN; seed 2 logs
# every other step only (the steps it lacks are absent: null on a chart)
RUNS = [
    (0, 0, [0, 1, 2, 3, 4, 5], [1.0, "NaN", 0.5, "Infinity", "-Infinity", 0.25]),
    (0, 1, [0, 1, 2, 3, 4, 5], [1.0, 0.9, 0.8, 0.7, 0.6, "-Infinity"]),
    (1, 0, [0, 1, 2, 3, 4, 5], [1.1, 0.9, 0.7, 0.6, 0.5, "NaN"]),
    (2, 0, [0, 2, 4], [1.2, 0.8, 0.4]),
]


@pytest.fixture
def external(api):
    r = api.post("/api/v1/studies", json={"name": "wire", "kind": "external", "metrics": ["loss"]})
    sid = r.json()["id"]
    ids = []
    for seed, repeat, steps, values in RUNS:
        body = {"seed": seed, "repeat": repeat, "stack": {"name": "a100"},
                "metrics": {"loss": {"steps": steps, "values": values}}, "step_times": [0.1, "Infinity"]}
        r = api.post(f"/api/v1/studies/{sid}/runs", json=body)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    return sid, ids


def test_upload_accepts_the_three_strings_and_refuses_null_and_other_spellings(api, external):
    sid, _ = external
    for bad in (None, "nan", "inf", "-inf", "Inf", "1.5", ""):
        body = {"seed": 9, "metrics": {"loss": {"steps": [0, 1], "values": [1.0, bad]}}}
        r = api.post(f"/api/v1/studies/{sid}/runs", json=body)
        assert r.status_code == 422, (bad, r.text)
        json.loads(r.text, parse_constant=_bare_constant)


def test_series_and_run_final_metrics_round_trip(api, external):
    sid, ids = external
    for (_, _, steps, values), run_id in zip(RUNS, ids):
        got = strict(api.get(f"/api/v1/runs/{run_id}/metrics/loss"))
        assert got["steps"] == steps and got["values"] == values  # the exact spelling, and the numbers
        run = strict(api.get(f"/api/v1/runs/{run_id}"))
        assert run["final_metrics"] == {"loss": values[-1]}
        assert strict(api.get(f"/api/v1/runs/{run_id}/metrics/step_time"))["values"] == [0.1, "Infinity"]
    listed = strict(api.get(f"/api/v1/studies/{sid}/runs"))
    assert sorted(r["final_metrics"]["loss"] for r in listed["items"] if isinstance(r["final_metrics"]["loss"], str)) \
        == ["-Infinity", "NaN"]


def test_report_bands_and_compare_spell_non_finite_values(api, external):
    sid, ids = external
    report = strict(api.get(f"/api/v1/studies/{sid}/report"))
    (rep,) = [v for v in report["verdicts"] if v["level"] == "repeatability"]
    # repeats 0 and 1 of seed 0 part at step 1 (NaN against 0.9): an infinite difference
    assert rep["verdict"] == "out_of_tolerance" and rep["max_abs_delta"] == "Infinity"
    assert rep["first_divergent_step"] == 1
    assert {(d["run_id"], d["step"]) for d in report["diverged"]} == {(ids[0], 1), (ids[1], 5), (ids[2], 5)}
    assert report["options"]["nonfinite_encoding"] == 'NaN, +Inf, -Inf -> "NaN", "Infinity", "-Infinity"; null: absent'

    bands = strict(api.get(f"/api/v1/studies/{sid}/bands", params={"metric": "loss"}))
    assert bands["groups"] and set(bands["groups"][0]["excluded_run_ids"]) >= {ids[2]}

    other = api.post("/api/v1/studies", json={"name": "other", "kind": "external", "metrics": ["loss"]}).json()["id"]
    for seed, final in enumerate([0.3, 0.31, "Infinity"]):
        body = {"seed": seed, "stack": {"name": "a100"}, "metrics": {"loss": {"steps": [0, 1], "values": [1.0, final]}}}
        assert api.post(f"/api/v1/studies/{other}/runs", json=body).status_code == 201
    compared = strict(api.get("/api/v1/compare", params={"baseline": sid, "candidate": other, "margin": 0.1}))
    assert compared["candidate"]["n_runs"] == 3 and compared["verdicts"]


def test_chart_data_carries_the_strings_and_null_only_where_a_point_is_absent(api, external):
    sid, ids = external
    chart = strict(api.get(f"/dashboard/data/studies/{sid}/chart",
                           params={"metric": "loss", "determinism": "seeded", "stack": "a100"}))
    assert chart["x"] == [0, 1, 2, 3, 4, 5] and not chart["downsampled"]
    lines = {ln["run_id"]: y for ln, y in zip(chart["lines"], chart["y"])}
    assert lines[ids[0]] == [1.0, "NaN", 0.5, "Infinity", "-Infinity", 0.25]
    assert lines[ids[1]][-1] == "-Infinity" and lines[ids[2]][-1] == "NaN"
    assert lines[ids[3]] == [1.2, None, 0.8, None, 0.4, None]  # steps seed 2 never logged
    run = strict(api.get(f"/dashboard/data/runs/{ids[0]}/chart", params={"key": "loss"}))
    assert run["y"] == [1.0, "NaN", 0.5, "Infinity", "-Infinity", 0.25] and run["diverged_at"] == 1
    diff = strict(api.get(f"/dashboard/data/studies/{sid}/difference",
                          params={"metric": "loss", "determinism": "seeded", "stack": "a100"}))
    # repeat 1 minus repeat 0: a difference with a non-finite side does not exist (null)
    assert diff["y"] == [[0.0, None, 0.3, None, None, None]]


def test_decimated_chart_keeps_a_non_finite_bucket_as_its_value(api):
    r = api.post("/api/v1/studies", json={"name": "long", "kind": "external", "metrics": ["loss"]})
    sid = r.json()["id"]
    values: list[float | str] = [1.0 / (1 + i) for i in range(400)]
    values[200:220] = ["Infinity"] * 20  # a whole bucket (400 steps into 100 buckets of 4) is +Inf
    run_id = api.post(f"/api/v1/studies/{sid}/runs", json={"seed": 0, "metrics": {
        "loss": {"steps": list(range(400)), "values": values}}}).json()["id"]
    chart = strict(api.get(f"/dashboard/data/runs/{run_id}/chart", params={"key": "loss", "max_points": 200}))
    assert chart["downsampled"] and "Infinity" in chart["y"] and None not in chart["y"]
    assert all(isinstance(v, (int, float)) for x, v in zip(chart["x"], chart["y"]) if not 200 <= x < 220)


def test_worker_protocol_sends_strict_json_and_the_server_reads_it(api):
    api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["seeded"]))
    leased = lease(api, register(api))
    run_id, lid = leased["run_id"], leased["lease_id"]
    values = [0.5, math.nan, math.inf, -math.inf]
    batch = MetricBatch(lease_id=lid, seq=0, series=[Series(key="loss", steps=[0, 1, 2, 3], values=values)])
    body = batch.model_dump_json(exclude_none=True)  # what steady.worker.agent.client sends
    assert json.loads(body, parse_constant=_bare_constant)["series"][0]["values"] == [0.5, "NaN", "Infinity", "-Infinity"]
    h = {**api.h("worker"), "content-type": "application/json"}
    assert api.client.post(f"/api/v1/runs/{run_id}/metrics", content=body, headers=h).status_code == 200
    assert strict(api.get(f"/api/v1/runs/{run_id}/metrics/loss"))["values"] == [0.5, "NaN", "Infinity", "-Infinity"]
    # an old worker's bare tokens are still read (one release): the same values
    old = json.dumps({"lease_id": lid, "seq": 1, "series": [{"key": "acc", "steps": [0], "values": [math.nan]}]})
    assert "NaN" in old and '"NaN"' not in old
    assert api.client.post(f"/api/v1/runs/{run_id}/metrics", content=old, headers=h).status_code == 200
    assert strict(api.get(f"/api/v1/runs/{run_id}/metrics/acc"))["values"] == ["NaN"]
    done = RunResult(**{**result(lid), "final_metrics": {"loss": -math.inf, "acc": math.nan}, "timings": {"wall_s": math.inf}})
    r = api.client.post(f"/api/v1/runs/{run_id}/complete", content=done.model_dump_json(exclude_none=True), headers=h)
    assert r.status_code == 200, r.text
    run = strict(api.get(f"/api/v1/runs/{run_id}"))
    assert run["final_metrics"] == {"loss": "-Infinity", "acc": "NaN"} and run["timings"] == {"wall_s": "Infinity"}


def test_mlflow_endpoint_reads_and_writes_the_same_strings(api):
    """MLflow's own wire format (proto3 JSON) spells doubles the same way; its clients are unchanged."""
    api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["seeded"]))
    leased = lease(api, register(api))
    h = {"Authorization": f"Bearer {leased['run_token']}"}
    base, rid = "/mlflow/api/2.0/mlflow", str(leased["run_id"])
    for step, value in enumerate(["NaN", "Infinity", "-Infinity"]):
        r = api.client.post(f"{base}/runs/log-metric", headers=h, json={"run_id": rid, "key": f"m{step}", "value": value,
                                                                         "step": step, "timestamp": 0})
        assert r.status_code == 200, r.text
    got = strict(api.client.get(f"{base}/runs/get", headers=h, params={"run_id": rid}))
    assert {m["key"]: m["value"] for m in got["run"]["data"]["metrics"]} == {"m0": "NaN", "m1": "Infinity", "m2": "-Infinity"}
    assert strict(api.get(f"/api/v1/runs/{rid}/metrics/m1"))["values"] == ["Infinity"]


def test_a_validation_error_echoing_a_bare_token_is_still_json(api):
    r = api.post("/api/v1/studies", json={"name": "x", "kind": "external", "metrics": ["loss"]})
    sid = r.json()["id"]
    body = '{"seed": 0, "metrics": {"loss": {"steps": [0, 1, 2], "values": [NaN, Infinity]}}}'
    r = api.client.post(f"/api/v1/studies/{sid}/runs", content=body, headers={**api.h(), "content-type": "application/json"})
    assert r.status_code == 422
    json.loads(r.text, parse_constant=_bare_constant)
    assert '"NaN"' in r.text and '"Infinity"' in r.text
