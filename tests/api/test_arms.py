"""Arms of any kind: a study compares arms that differ by params, config file or stack (by code:
tests/api/test_arm_code.py)."""

from __future__ import annotations

import pytest

from steady.server.reports.models import Report
from steady.server.cli.render import render_report
from tests.api.helpers import batch, lease, register, result, spec

ARMS = [
    {"name": "old", "params": {"lr": 0.1}},
    {"name": "new", "params": {"lr": 0.2}, "config": {"name": "train.yaml", "content": "warmup: 10\n"}},
]


def _finish_all(api, worker_id: int, final: dict[str, float]) -> list[dict]:
    """A fake worker: lease every run, log a short loss curve ending at the arm's final value, complete."""
    leases = []
    while (got := lease(api, worker_id)) is not None:
        leases.append(got)
        lid, run_id = got["lease_id"], got["run_id"]
        end = final[got["spec"]["stack"]] + 0.001 * got["spec"]["seed"]
        r = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=batch(lid, 0, "loss", [0, 1], [1.0, end]))
        assert r.status_code == 200, r.text
        r = api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid, final_metrics={"loss": end}))
        assert r.status_code == 200, r.text
    return leases


def test_arms_run_with_their_overrides_and_the_report_names_the_difference(api):
    body = spec(seeds=[0, 1, 2, 3], repeats=1, determinism=["seeded"], arms=ARMS,
                metrics=[{"name": "loss", "margin": 0.05}])
    body["workload"]["params"] = {"epochs": 1, "lr": 0.5}
    r = api.post("/api/v1/studies", json=body)
    assert r.status_code == 201, r.text
    study = r.json()
    assert study["progress"]["total"] == 4 * 2
    runs = api.get(f"/api/v1/studies/{study['id']}/runs", params={"limit": 50}).json()["items"]
    assert sorted({x["stack"] for x in runs}) == ["new", "old"]

    leases = _finish_all(api, register(api), {"old": 0.30, "new": 0.30})
    assert len(leases) == 8
    by_arm = {x["spec"]["stack"]: x["spec"] for x in leases}
    assert by_arm["old"]["params"] == {"epochs": 1, "lr": 0.1} and by_arm["old"]["config_file"] is None
    assert by_arm["new"]["params"] == {"epochs": 1, "lr": 0.2}
    assert by_arm["new"]["config_file"] == {"name": "train.yaml", "content": "warmup: 10\n"}
    assert by_arm["old"]["code"] is None and by_arm["new"]["code_sha256"] is None  # built-in: no code

    report = api.get(f"/api/v1/studies/{study['id']}/report").json()
    (v,) = [v for v in report["verdicts"] if v["level"] == "stack_portability"]
    assert (v["group"]["reference_stack"], v["group"]["candidate_stack"]) == ("old", "new")
    assert v["verdict"] == "equivalent", v["reason"]
    differ = v["group"]["differ_by"]
    assert "params.lr (0.1 vs 0.2)" in differ
    assert any(d.startswith("config (none vs train.yaml sha256:") for d in differ), differ
    assert not any(d.startswith("code") for d in differ), differ
    assert report["arms"] == [{"reference": "old", "candidate": "new", "differ_by": differ}]
    text = render_report(Report.model_validate(report))
    assert "arms differ by: params.lr (0.1 vs 0.2); config (none vs train.yaml" in text

    page = api.client.get(f"/studies/{study['id']}", headers=api.h())
    assert page.status_code == 200, page.text  # the dashboard shows it next to the portability verdict
    assert "arms differ by: params.lr (0.1 vs 0.2)" in page.text


def test_arms_that_differ_are_judged_not_equivalent(api):
    body = spec(seeds=[0, 1, 2, 3], repeats=1, determinism=["seeded"], reference_stack="new",
                arms=[{"name": "old", "params": {"lr": 0.1}}, {"name": "new", "stack": {"name": "gpu", "labels": ["torch"]}}],
                metrics=[{"name": "loss", "margin": 0.01}])
    sid = api.post("/api/v1/studies", json=body).json()["id"]
    _finish_all(api, register(api), {"old": 0.9, "new": 0.3})
    report = api.get(f"/api/v1/studies/{sid}/report").json()
    (v,) = [v for v in report["verdicts"] if v["level"] == "stack_portability"]
    assert v["verdict"] == "not_equivalent", v["reason"]
    assert v["group"]["differ_by"] == ["stack (gpu[torch] vs any)", "params.lr (unset vs 0.1)"]


def test_stacks_shorthand_reports_the_stack_difference(api):
    sid = api.post("/api/v1/studies", json=spec(seeds=[0, 1], repeats=1, determinism=["seeded"],
                                                stacks=[{"name": "a"}, {"name": "b"}])).json()["id"]
    runs = api.get(f"/api/v1/studies/{sid}/runs").json()["items"]
    assert sorted({x["stack"] for x in runs}) == ["a", "b"]
    _finish_all(api, register(api), {"a": 0.3, "b": 0.3})
    report = api.get(f"/api/v1/studies/{sid}/report").json()
    assert report["arms"] == [{"reference": "a", "candidate": "b", "differ_by": ["stack (a vs b)"]}]


@pytest.mark.parametrize(
    ("arms", "extra", "field", "needle"),
    [
        ([{"name": "a", "params": {"lr": 1}}, {"name": "a", "params": {"lr": 2}}], {}, "arms", "repeated: ['a']"),
        ([{"name": "a", "params": {"lr": 1}}, {"name": "b", "params": {"lr": 1}}], {}, "arms", "identical"),
        ([{"name": "a"}, {"name": "b", "lr": 2}], {}, "arms.1.lr", "Extra inputs"),
        ([{"name": "a", "params": {"lr": 2}}], {}, "arms", "at least 2"),
        ([{"name": "a"}, {"name": "b", "params": {"lr": 2}}], {"stacks": [{"name": "s1"}, {"name": "s2"}]}, "", "not both"),
        ([{"name": "a"}, {"name": "b", "params": {"lr": 2}}], {"reference_stack": "c"}, "", "one of the arms"),
        ([{"name": "a"}, {"name": "b", "config": {"name": "../x", "content": ""}}], {}, "arms.1.config.name", "pattern"),
        ([{"name": "a"}, {"name": "b", "params": {"x": "y" * 70_000}}], {}, "arms.1.params", "the limit is"),
    ],
)
def test_bad_arms_are_422_naming_the_field(api, arms, extra, field, needle):
    r = api.post("/api/v1/studies", json=spec(arms=arms, **extra))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(field in ".".join(map(str, d["loc"])) and needle in d["msg"] for d in detail), detail
