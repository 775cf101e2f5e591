from __future__ import annotations

import pytest

from tests.api.helpers import spec
from tests.conftest import BOTH_BACKENDS, SQLITE_ONLY

pytestmark = SQLITE_ONLY  # the studies' SQL is the ORM's, the same on both backends; leasing's differs (below)


def test_create_expands_matrix(api):
    r = api.post("/api/v1/studies", json=spec(stacks=[{"name": "a"}, {"name": "b", "labels": ["gpu"]}]))
    assert r.status_code == 201, r.text
    study = r.json()
    assert study["status"] == "queued"
    assert study["progress"]["total"] == 2 * 2 * 2 * 2
    runs = api.get(f"/api/v1/studies/{study['id']}/runs", params={"limit": 500}).json()
    assert runs["total"] == 16
    combos = {(x["seed"], x["repeat"], x["determinism"], x["stack"]) for x in runs["items"]}
    assert len(combos) == 16
    assert {x["status"] for x in runs["items"]} == {"queued"}


@pytest.mark.parametrize(
    ("change", "field", "needle"),
    [
        ({"seeds": []}, "", "at least one seed"),
        ({"workload": {"framework": "jax", "name": "torch_mlp"}}, "framework", "torch"),
        ({"workload": {"framework": "python", "name": "torch_mlp"}}, "workload.framework", "runs on torch, 'python' is"),
        ({"workload": {"framework": "tensorflow", "name": "torch_mlp"}}, "workload.framework", "runs on torch"),
        ({"workload": {"framework": "torch", "name": "nope"}}, "workload", "unknown built-in workload"),
        ({"workload": {"framework": "torch"}}, "workload", "exactly one"),
        ({"determinism": ["seeded", "seeded"]}, "determinism", "distinct"),
        ({"determinism": ["chaotic"]}, "determinism", "none"),
        ({"repeats": 0}, "repeats", "greater than or equal to 1"),
        ({"seeds": [1, 1]}, "seeds", "distinct"),
        ({"metrics": [{"name": "loss", "atol": -1}]}, "atol", "greater than or equal"),
        ({"reference_stack": "nope"}, "", "reference_stack"),
        ({"name": ""}, "name", "at least 1"),
        ({"unknown_field": 1}, "unknown_field", "Extra inputs"),
    ],
)
def test_bad_specs_are_422_naming_the_field(api, change, field, needle):
    r = api.post("/api/v1/studies", json=spec(**change))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(field in ".".join(map(str, d["loc"])) and needle in d["msg"] for d in detail), detail


def test_matrix_over_cap_is_refused(make_api):
    api = make_api(max_runs_per_study=10)
    r = api.post("/api/v1/studies", json=spec(seeds=list(range(5)), repeats=2))  # 5*2*2 = 20
    assert r.status_code == 422
    (d,) = r.json()["detail"]
    assert d["loc"] == ["body", "seeds"] and "20 runs" in d["msg"] and "limit of 10" in d["msg"]


def test_malformed_json_and_wrong_types(api):
    r = api.client.post("/api/v1/studies", content=b"{not json", headers={**api.h(), "content-type": "application/json"})
    assert r.status_code == 422
    r = api.post("/api/v1/studies", json=spec(seeds="zero"))
    assert r.status_code == 422
    r = api.post("/api/v1/studies", json=[1, 2])
    assert r.status_code == 422


def test_list_filter_paginate_and_read(api):
    ids = [api.post("/api/v1/studies", json=spec(name=f"s{i}")).json()["id"] for i in range(5)]
    page = api.get("/api/v1/studies", params={"limit": 2, "offset": 1}).json()
    assert page["total"] == 5 and [s["id"] for s in page["items"]] == [ids[3], ids[2]]
    assert api.get("/api/v1/studies", params={"status": "completed"}).json()["total"] == 0
    assert api.get("/api/v1/studies", params={"name": "s4"}).json()["items"][0]["id"] == ids[4]
    assert api.get("/api/v1/studies", params={"status": "bogus"}).status_code == 422
    assert api.get(f"/api/v1/studies/{ids[0]}").json()["name"] == "s0"
    assert api.get("/api/v1/studies/999999").status_code == 404
    assert api.get("/api/v1/runs/999999").status_code == 404
    runs = api.get(f"/api/v1/studies/{ids[0]}/runs", params={"status": "queued", "limit": 3}).json()
    assert runs["total"] == 8 and len(runs["items"]) == 3


def test_cancel_study(api):
    from tests.api.helpers import lease, register

    sid = api.post("/api/v1/studies", json=spec()).json()["id"]
    wid = register(api)
    leased = lease(api, wid)
    r = api.post(f"/api/v1/studies/{sid}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    counts = r.json()["progress"]
    assert counts["cancelled"] == 7 and counts["running"] == 1
    hb = api.post(f"/api/v1/runs/{leased['run_id']}/heartbeat", role="worker", json={"lease_id": leased["lease_id"]})
    assert hb.json()["cancel"] is True
    r = api.post(
        f"/api/v1/runs/{leased['run_id']}/fail",
        role="worker",
        json={"lease_id": leased["lease_id"], "kind": "cancelled", "error": "cancelled"},
    )
    assert r.json()["status"] == "cancelled"
    study = api.get(f"/api/v1/studies/{sid}").json()
    assert study["status"] == "cancelled" and study["progress"]["cancelled"] == 8
    assert lease(api, wid) is None


@BOTH_BACKENDS
def test_runs_are_leased_with_levels_interleaved(make_api):
    """Runs of the compared determinism levels alternate in the queue (A B C, C B A, …), so a load
    drift over the study does not read as a cost of determinism (steady.server.stats.cost)."""
    from tests.api.helpers import lease, register

    api = make_api(max_leases_per_worker=13)  # one worker holds the whole queue, then asks once more

    levels = ["none", "seeded", "strict"]
    sid = api.post("/api/v1/studies", json=spec(seeds=[0, 1], repeats=2, determinism=levels)).json()["id"]
    wid = register(api)
    order = []
    while (leased := lease(api, wid)) is not None:
        run = api.get(f"/api/v1/runs/{leased['run_id']}").json()
        assert run["study_id"] == sid
        order.append((run["seed"], run["repeat"], run["determinism"]))
    assert len(order) == 12
    blocks = [order[i:i + 3] for i in range(0, 12, 3)]
    for k, block in enumerate(blocks):
        assert len({(s, r) for s, r, _ in block}) == 1  # one seed × repeat per block
        assert [lv for _, _, lv in block] == (levels if k % 2 == 0 else levels[::-1])
    assert [b[0][:2] for b in blocks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    mean_pos = {lv: sum(i for i, x in enumerate(order) if x[2] == lv) / 4 for lv in levels}
    assert mean_pos["none"] == mean_pos["seeded"] == mean_pos["strict"]  # a linear drift cancels


@pytest.mark.parametrize("budget", [1.0, 0.5, -2, "inf", "nan"])
def test_cost_budget_must_be_a_finite_ratio_above_one(api, budget):
    r = api.post("/api/v1/studies", json=spec(cost_budget=budget))
    assert r.status_code == 422, r.text
    assert any("cost_budget" in ".".join(map(str, d["loc"])) for d in r.json()["detail"]), r.json()


def test_cost_budget_is_kept_in_the_spec(api):
    r = api.post("/api/v1/studies", json=spec(cost_budget=1.5))
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["cost_budget"] == 1.5


@BOTH_BACKENDS
def test_each_block_of_levels_stays_on_one_worker(api):
    """Two workers leasing in turn: the runs of one seed × repeat (one per level) go to the worker
    that started the block, one after the other, so the report can compare them paired."""
    from tests.api.helpers import lease, register, result

    sid = api.post("/api/v1/studies", json=spec(seeds=[0, 1, 2, 3], repeats=1, determinism=["seeded", "strict"]))
    sid = sid.json()["id"]
    w1, w2 = register(api, "w1"), register(api, "w2")
    held: dict[int, dict] = {}
    ran: dict[tuple[int, int], set[int]] = {}
    for _ in range(8):
        for w in (w1, w2):
            if w in held:
                leased = held.pop(w)
                r = api.post(f"/api/v1/runs/{leased['run_id']}/complete", role="worker",
                             json=result(leased["lease_id"]))
                assert r.status_code == 200, r.text
            leased = lease(api, w)
            if leased is not None:
                held[w] = leased
                run = api.get(f"/api/v1/runs/{leased['run_id']}").json()
                ran.setdefault((run["seed"], run["repeat"]), set()).add(w)
    runs = api.get(f"/api/v1/studies/{sid}/runs", params={"limit": 100}).json()["items"]
    assert len(ran) == 4 and all(len(ws) == 1 for ws in ran.values()), ran
    assert {r["worker_id"] for r in runs} == {w1, w2}
