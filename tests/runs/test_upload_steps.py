"""One value per (run, key, step) through the upload door too: a run uploaded into an external study that
gives one step two different values is refused with a 422 naming the series and the step (never stored
with the second value silently dropped); the same value twice stays silent, and the first is what is read."""

from __future__ import annotations

import pytest

from tests.conftest import SQLITE_ONLY

pytestmark = SQLITE_ONLY  # validation before any SQL


@pytest.fixture
def study(api) -> int:
    r = api.post("/api/v1/studies", json={"name": "uploads", "kind": "external", "metrics": ["loss"]})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_a_step_given_twice_with_two_values_is_422_naming_it(api, study):
    body = {"seed": 0, "metrics": {"loss": {"steps": [0, 10, 20, 10], "values": [1.0, 0.5, 0.25, 0.75]}}}
    r = api.post(f"/api/v1/studies/{study}/runs", json=body)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"][:3] == ["body", "metrics", "loss"], err
    assert "step 10 is given twice, with 0.5 and then 0.75" in err["msg"], err
    runs = api.get(f"/api/v1/studies/{study}/runs").json()["items"]
    assert runs == []  # nothing stored


def test_the_same_value_twice_is_one_point(api, study):
    body = {"seed": 0, "metrics": {"loss": {"steps": [0, 1, 1, 2], "values": [1.0, "NaN", "NaN", 0.5]}}}
    r = api.post(f"/api/v1/studies/{study}/runs", json=body)
    assert r.status_code == 201, r.text
    got = api.get(f"/api/v1/runs/{r.json()['id']}/metrics/loss").json()
    assert got["steps"] == [0, 1, 2] and got["values"] == [1.0, "NaN", 0.5], got
