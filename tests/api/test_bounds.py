"""Bounds and names a user writes: suite and config names that could never work are refused at
submit, and one run's MLflow params and tags are capped."""

from __future__ import annotations

import pytest

from tests.api.helpers import spec
from tests.conftest import SQLITE_ONLY
from steady.server.mlflow.schemas import MAX_RUN_PARAMS, MAX_RUN_PARAMS_TAGS_BYTES, MAX_TAG_LENGTH

MLFLOW = "/mlflow/api/2.0/mlflow"

pytestmark = SQLITE_ONLY  # plain ORM code and pydantic: the same on both backends


@pytest.mark.parametrize("suite", ["nightly/resnet", "a\\b", ".", "..", "line\nbreak"])
def test_a_suite_name_that_cannot_be_addressed_is_a_422(api, suite):
    """``/api/v1/suites/{suite}/baseline`` is one path segment: a study of suite 'a/b' got a baseline
    nobody could ever set or read."""
    r = api.post("/api/v1/studies", json=spec(suite=suite))
    assert r.status_code == 422, r.text
    (detail,) = r.json()["detail"]
    assert detail["loc"] == ["body", "suite"] and "suite name may not" in detail["msg"]
    rule = {"kind": "band_width", "metric": "loss", "max": 10.0, "suite": suite}
    r = api.post("/api/v1/alert-rules", json=rule)
    assert r.status_code == 422 and "suite name may not" in r.text, r.text


def test_an_addressable_suite_name_is_kept(api):
    r = api.post("/api/v1/studies", json=spec(suite="nightly resnet-50 (v2)"))
    assert r.status_code == 201, r.text
    assert api.get("/api/v1/suites/nightly%20resnet-50%20%28v2%29/baseline").status_code == 404  # addressable: no baseline yet


@pytest.mark.parametrize("name", [".", ".."])
def test_a_config_file_named_dot_or_dotdot_is_a_422(api, name):
    """Every run of such an arm failed writing its config file."""
    arms = [{"name": "a"}, {"name": "b", "config": {"name": name, "content": "x: 1\n"}}]
    r = api.post("/api/v1/studies", json=spec(arms=arms))
    assert r.status_code == 422, r.text
    (detail,) = r.json()["detail"]
    assert detail["loc"] == ["body", "arms", 1, "config", "name"] and "must name a file" in detail["msg"]


def _external_run(api) -> str:
    exp = api.post(f"{MLFLOW}/experiments/create", json={"name": "bounds-mlflow"})
    assert exp.status_code == 200, exp.text
    run = api.post(f"{MLFLOW}/runs/create", json={"experiment_id": exp.json()["experiment_id"]})
    assert run.status_code == 200, run.text
    return run.json()["run"]["info"]["run_id"]


def test_mlflow_tags_per_run_are_capped_by_size(api):
    """100 × 8 KB tags per call, call after call, once grew one run's record to 48 MB."""
    run_id = _external_run(api)
    big = "x" * MAX_TAG_LENGTH
    for call in range(MAX_RUN_PARAMS_TAGS_BYTES // (100 * MAX_TAG_LENGTH) + 2):
        tags = [{"key": f"t{call}_{i}", "value": big} for i in range(100)]
        r = api.post(f"{MLFLOW}/runs/log-batch", json={"run_id": run_id, "tags": tags})
        if r.status_code != 200:
            break
    assert r.status_code == 413, r.text
    assert r.json()["error_code"] == "RESOURCE_LIMIT_EXCEEDED" and str(MAX_RUN_PARAMS_TAGS_BYTES) in r.json()["message"]
    held = api.get(f"{MLFLOW}/runs/get", params={"run_id": run_id}).json()["run"]["data"]["tags"]
    size = sum(len(t["key"]) + len(t["value"]) for t in held)
    refused = sum(len(t["key"]) + len(t["value"]) for t in tags)
    assert size <= MAX_RUN_PARAMS_TAGS_BYTES < size + refused  # refused at the limit, not before; nothing of it kept
    again = api.post(f"{MLFLOW}/runs/log-batch", json={"run_id": run_id, "tags": [{"key": "t0_0", "value": big}]})
    assert again.status_code == 200, again.text  # a re-sent tag adds nothing


def test_mlflow_params_per_run_are_capped_by_count(api):
    run_id = _external_run(api)
    for call in range(MAX_RUN_PARAMS // 100):
        params = [{"key": f"p{call}_{i}", "value": "1"} for i in range(100)]
        assert api.post(f"{MLFLOW}/runs/log-batch", json={"run_id": run_id, "params": params}).status_code == 200
    r = api.post(f"{MLFLOW}/runs/log-parameter", json={"run_id": run_id, "key": "one_more", "value": "1"})
    assert r.status_code == 413 and f"the limit is {MAX_RUN_PARAMS} per run" in r.json()["message"], r.text
