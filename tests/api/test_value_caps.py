"""Every stored user value has a cap, answered 422 naming the field (#51's findings 3 and 5): a launch's
detail as a whole (it was capped in keys only: 30 MB were accepted, and listed by `steady status` of every
user), and the nesting depth of a study's params (900 levels were a 500 at submit: the serializer's own
depth limit)."""

from __future__ import annotations

from steady.server.kit.bounds import MAX_NESTING, nesting
from steady.server.launches.schemas import MAX_DETAIL_BYTES
from tests.api.helpers import spec
from tests.conftest import SQLITE_ONLY

pytestmark = SQLITE_ONLY


def _nested(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def _loc(r) -> list:
    assert r.status_code == 422, r.text
    return r.json()["detail"][0]["loc"]


def test_nesting_is_counted_without_recursion():
    assert nesting(1) == 0 and nesting({}) == 1 and nesting({"a": [1, {"b": []}]}) == 4
    assert nesting(_nested(100_000), limit=MAX_NESTING) == MAX_NESTING + 1  # stops past the limit


def test_params_nested_past_the_cap_are_422_naming_the_field(api):
    r = api.post("/api/v1/studies", json=spec(workload={"framework": "torch", "name": "torch_mlp",
                                                        "params": _nested(900)}))
    assert _loc(r)[-1] == "params" and "workload" in _loc(r), r.text
    assert "levels deep" in r.text
    arms = [{"name": "a", "params": _nested(MAX_NESTING + 1)}, {"name": "b"}]
    r = api.post("/api/v1/studies", json=spec(arms=arms))
    assert _loc(r)[-1] == "params" and "arms" in _loc(r), r.text
    ok = api.post("/api/v1/studies", json=spec(workload={"framework": "torch", "name": "torch_mlp",
                                                         "params": {"epochs": 1, "deep": _nested(MAX_NESTING - 1)}}))
    assert ok.status_code == 201, ok.text


def test_a_launch_detail_is_capped_as_a_whole(api):
    study = api.post("/api/v1/studies", json=spec()).json()["id"]
    body = {"engine": "slurm", "job_id": "1", "tasks": 1}
    big = {"script": "x" * (MAX_DETAIL_BYTES + 1)}  # one key: the old cap counted keys only
    r = api.post(f"/api/v1/studies/{study}/launches", json={**body, "detail": big})
    assert _loc(r) == ["body", "detail"] and str(MAX_DETAIL_BYTES) in r.text, r.text
    r = api.post(f"/api/v1/studies/{study}/launches", json={**body, "detail": _nested(MAX_NESTING + 1)})
    assert _loc(r) == ["body", "detail"], r.text
    ok = api.post(f"/api/v1/studies/{study}/launches", json={**body, "detail": {"script": "/tmp/x.sbatch"}})
    assert ok.status_code == 201, ok.text


def test_an_uploaded_runs_stack_and_digests_are_capped(api):
    from steady.server.runs.schemas import MAX_EXTERNAL_DIGESTS_BYTES, MAX_EXTERNAL_STACK_BYTES

    study = api.post("/api/v1/studies", json={"name": "elsewhere", "kind": "external", "metrics": ["loss"]}).json()["id"]
    run = {"seed": 0, "determinism": "seeded", "metrics": {"loss": {"steps": [0, 1], "values": [1.0, 0.5]}}}
    for field, value in (("stack", {"name": "a", "blob": "x" * MAX_EXTERNAL_STACK_BYTES}),
                         ("digests", {"weights": "x" * MAX_EXTERNAL_DIGESTS_BYTES}),
                         ("stack", {"name": "a", "deep": _nested(MAX_NESTING + 1)})):
        r = api.post(f"/api/v1/studies/{study}/runs", json={**run, field: value})
        assert _loc(r) == ["body", field], r.text
    ok = api.post(f"/api/v1/studies/{study}/runs", json={**run, "stack": {"name": "a100"}, "digests": {"w": "ab"}})
    assert ok.status_code == 201, ok.text
