"""Every input limit in one place: each refused with a clear 4xx whose message names the limit."""

from __future__ import annotations

import json

import pytest

from steady.server.studies.spec_parts import MAX_PARAMS_BYTES
from tests.api.helpers import batch, lease, register, spec
from steady.worker.contract.protocol import (
    MAX_ERROR_LENGTH,
    MAX_KEY_LENGTH,
    MAX_LABELS,
    MAX_NAME_LENGTH,
    MAX_SERIES_PER_BATCH,
)


def _detail(r) -> str:
    return json.dumps(r.json()["detail"])


@pytest.fixture
def small(make_api):
    return make_api(max_body_bytes=256 * 1024, max_batch_points=1000, max_runs_per_study=10)


@pytest.fixture
def leased(small):
    small.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["seeded"]))
    got = lease(small, register(small))
    return small, got["run_id"], got["lease_id"]


def test_body_size_with_and_without_content_length(small):
    r = small.post("/api/v1/studies", json=spec(description="x" * 300_000))
    assert r.status_code == 413 and "262144 bytes (STEADY_MAX_BODY_BYTES)" in _detail(r)

    def chunks():
        for _ in range(40):
            yield b" " * 8192  # streamed: no Content-Length header
    r = small.client.post("/api/v1/studies", content=chunks(), headers={**small.h(), "content-type": "application/json"})
    assert r.status_code == 413 and "STEADY_MAX_BODY_BYTES" in _detail(r)


def test_batch_points(leased):
    api, run_id, lid = leased
    r = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=batch(lid, 0, "loss", list(range(1001)), [0.0] * 1001))
    assert r.status_code == 413 and "limit of 1000 points (STEADY_MAX_BATCH_POINTS)" in _detail(r)


def test_series_per_batch(leased):
    api, run_id, lid = leased
    series = [{"key": f"k{i}", "steps": [0], "values": [0.0]} for i in range(MAX_SERIES_PER_BATCH + 1)]
    r = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json={"lease_id": lid, "seq": 0, "series": series})
    assert r.status_code == 422 and f"at most {MAX_SERIES_PER_BATCH}" in _detail(r)


def test_runs_per_study(small):
    r = small.post("/api/v1/studies", json=spec(seeds=list(range(6)), repeats=1, determinism=["seeded", "strict"]))
    assert r.status_code == 422 and "over the limit of 10 runs per study (STEADY_MAX_RUNS_PER_STUDY)" in _detail(r)


@pytest.mark.parametrize(
    ("what", "body", "limit"),
    [
        ("study name", spec(name="n" * (MAX_NAME_LENGTH + 1)), MAX_NAME_LENGTH),
        ("description", spec(description="d" * 10_001), 10_000),
        ("metric key", spec(metrics=[{"name": "k" * (MAX_KEY_LENGTH + 1)}]), MAX_KEY_LENGTH),
        ("stack labels", spec(stacks=[{"name": "s", "labels": [f"l{i}" for i in range(MAX_LABELS + 1)]}]), MAX_LABELS),
        ("stacks", spec(stacks=[{"name": f"s{i}"} for i in range(101)]), 100),
        ("entrypoint", spec(workload={"framework": "torch", "entrypoint": "m:" + "f" * 600}), 500),
    ],
)
def test_string_and_list_lengths_in_specs(api, what, body, limit):
    r = api.post("/api/v1/studies", json=body)
    assert r.status_code == 422 and f"at most {limit}" in _detail(r), (what, r.text[:300])


def test_workload_params_are_bounded_and_lists_carry_no_spec(api):
    big = {"framework": "torch", "name": "torch_mlp", "params": {"blob": "x" * (MAX_PARAMS_BYTES + 1)}}
    r = api.post("/api/v1/studies", json=spec(workload=big))
    assert r.status_code == 422 and f"the limit is {MAX_PARAMS_BYTES}" in _detail(r)
    ok = api.post("/api/v1/studies", json=spec(workload={**big, "params": {"blob": "x" * 1000}}))
    assert ok.status_code == 201 and ok.json()["spec"]["workload"]["params"]["blob"] == "x" * 1000
    listed = api.get("/api/v1/studies").json()["items"]
    assert listed and all("spec" not in s for s in listed)  # 25 large specs made one list answer 734 MB
    assert "spec" in api.get(f"/api/v1/studies/{ok.json()['id']}").json()


def test_worker_side_lengths(leased):
    api, run_id, lid = leased
    r = api.post("/api/v1/workers/register", role="worker", json={"name": "w" * (MAX_NAME_LENGTH + 1)})
    assert r.status_code == 422 and f"at most {MAX_NAME_LENGTH}" in _detail(r)
    r = api.post("/api/v1/workers/register", role="worker", json={"name": "w", "labels": [f"l{i}" for i in range(MAX_LABELS + 1)]})
    assert r.status_code == 422 and f"at most {MAX_LABELS}" in _detail(r)
    long_key = {"key": "k" * (MAX_KEY_LENGTH + 1), "steps": [0], "values": [0.0]}
    r = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json={"lease_id": lid, "seq": 0, "series": [long_key]})
    assert r.status_code == 422 and f"at most {MAX_KEY_LENGTH}" in _detail(r)
    r = api.post(f"/api/v1/runs/{run_id}/fail", role="worker", json={"lease_id": lid, "error": "e" * (MAX_ERROR_LENGTH + 1)})
    assert r.status_code == 422 and f"at most {MAX_ERROR_LENGTH}" in _detail(r)


def test_page_size(api):
    r = api.get("/api/v1/studies", params={"limit": 501})
    assert r.status_code == 422 and "500" in _detail(r)


def test_uploaded_run_points(make_api):
    api = make_api(max_batch_points=100)
    sid = api.post("/api/v1/studies", json={"name": "ext", "kind": "external", "metrics": ["acc"]}).json()["id"]
    run = {"seed": 0, "determinism": "seeded", "metrics": {"acc": {"steps": list(range(101)), "values": [0.0] * 101}}}
    r = api.post(f"/api/v1/studies/{sid}/runs", json=run)
    assert r.status_code in (413, 422) and "STEADY_MAX_BATCH_POINTS" in _detail(r), r.text[:300]


def test_ids_beyond_64_bits(api):
    """An id no database column can hold is a 422, not a 500 (SQLite) or a 503 'database down' (PostgreSQL)."""
    huge = 2**64
    for path in (f"/api/v1/runs/{huge}", f"/api/v1/studies/{huge}", f"/api/v1/runs/{huge}/metrics/loss"):
        r = api.get(path)
        assert r.status_code == 422 and "64-bit" in _detail(r), (path, r.status_code, r.text)
