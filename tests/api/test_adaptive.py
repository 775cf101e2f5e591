"""Adaptive seeds end to end over REST: a study with a budget grows in stages while its
seed-stability verdict is inconclusive, and stops when it is conclusive or the budget is spent."""
from __future__ import annotations

import numpy as np
import pytest

from steady.server.reports.models import Report
from steady.server.cli.render import render_report
from steady.server.stats.sequential import sequential_seed_decision, stage_sizes
from tests.api.helpers import batch, lease, register, result


def _final(seed: int, sd: float) -> float:
    return float(sd * np.random.default_rng(1000 + seed).standard_normal())


def _spec(*, max_seeds: int, **budget) -> dict:
    return {"name": "adaptive", "workload": {"framework": "torch", "name": "torch_mlp"}, "seeds": [0, 1, 2, 3, 4],
            "determinism": ["seeded"], "metrics": [{"name": "loss", "max_std": 1.0}],
            "budget": {"max_seeds": max_seeds, **budget}}


def _work(api, wid: int, sd: float) -> list[int]:
    """Run every queued run: loss 1.0 at step 0, the seed's final value at step 1. Returns the seeds run."""
    seeds = []
    while (leased := lease(api, wid)) is not None:
        lid, run_id, seed = leased["lease_id"], leased["run_id"], leased["spec"]["seed"]
        body = batch(lid, 0, "loss", [0, 1], [1.0, _final(seed, sd)])
        assert api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=body).status_code == 200
        assert api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid)).status_code == 200
        seeds.append(seed)
    return seeds


def test_inconclusive_study_grows_until_conclusive(api):
    sid = api.post("/api/v1/studies", json=_spec(max_seeds=30, stage_seeds=5)).json()["id"]
    study = api.get(f"/api/v1/studies/{sid}").json()
    assert study["stage"] == {"stage": 1, "last_stage": 6, "seeds": 5, "max_seeds": 30}
    seeds = _work(api, register(api), sd=0.3)
    assert sorted(seeds) == list(range(15))  # three stages of 5 seeds
    study = api.get(f"/api/v1/studies/{sid}").json()
    assert study["status"] == "completed" and study["stage"]["stage"] == 3 and study["progress"]["total"] == 15
    report = api.get(f"/api/v1/studies/{sid}/report").json()
    assert [(s["stage"], s["seeds"], s["outcome"]) for s in report["stages"]] == [
        (1, [0, 1, 2, 3, 4], "continue"), (2, [5, 6, 7, 8, 9], "continue"), (3, [10, 11, 12, 13, 14], "conclusive")]
    (v,) = [v for v in report["verdicts"] if v["level"] == "seed_stability"]
    assert v["verdict"] == "stable" and v["sequential"]["decided_at"] == 3
    assert "stable at stage 3 with 15 seeds" in v["reason"] and "over all stages" in v["guarantee"]
    # the stages' boundaries and decisions are those of the pure sequential rule on the same values
    x = np.array([_final(s, 0.3) for s in range(15)])
    ref = sequential_seed_decision(np.split(x, [5, 10]), max_std=1.0, max_seeds=30, last_stage=6)
    assert [d["boundary"] for s in report["stages"] for d in s["decisions"]] == pytest.approx(
        [look.boundary for look in ref.stages])
    assert [d["decision"] for s in report["stages"] for d in s["decisions"]] == ["inconclusive", "inconclusive",
                                                                                  "stable"]
    assert len(stage_sizes(5, 5, 30)) == 6
    # shown by `steady report` and on the dashboard's study page
    text = render_report(Report.model_validate(report))
    assert "Adaptive seeds — stage 3 of at most 6" in text and "stage 3: +5 seeds (10..14) → conclusive" in text
    page = api.get(f"/studies/{sid}")
    assert page.status_code == 200 and page.text.count('data-stage="') == 3 and "Adaptive seeds" in page.text


def test_study_whose_budget_is_spent_ends_inconclusive(api):
    sid = api.post("/api/v1/studies", json=_spec(max_seeds=10)).json()["id"]
    seeds = _work(api, register(api), sd=1.0)
    assert sorted(seeds) == list(range(10))
    study = api.get(f"/api/v1/studies/{sid}").json()
    assert study["status"] == "completed" and study["stage"] == {"stage": 2, "last_stage": 2, "seeds": 10,
                                                                   "max_seeds": 10}
    report = api.get(f"/api/v1/studies/{sid}/report").json()
    assert [s["outcome"] for s in report["stages"]] == ["continue", "budget_spent"]
    (v,) = [v for v in report["verdicts"] if v["level"] == "seed_stability"]
    assert v["verdict"] == "inconclusive" and v["sequential"]["final"] and "budget spent" in v["reason"]
    assert report["stages"][-1]["decisions"][0]["info_fraction"] == 1.0  # the last stage spends what is left


@pytest.mark.parametrize(
    ("change", "field", "needle"),
    [
        ({"budget": {"max_seeds": 3}}, "body.budget.max_seeds", "below the 5 seeds"),
        ({"budget": {"max_seeds": 10, "max_runs": 2}}, "body.budget.max_runs", "below the 5 runs"),
        ({"budget": {"max_seeds": 10, "spending": "haybittle"}}, "body.budget.spending", "pocock"),
        ({"budget": {"max_seeds": 10}, "metrics": ["loss"]}, "body.budget", "max_std"),
        ({"budget": {"max_seeds": 10, "stage_seeds": 0}}, "body.budget.stage_seeds", "greater than or equal to 1"),
        ({"budget": {"max_seeds": 100, "stage_seeds": 1}}, "body.budget.stage_seeds", "at most 20 stages"),
        ({"budget": {"max_seeds": 10, "max_minutes": 0}}, "body.budget.max_minutes", "greater than 0"),
        ({"kind": "external", "workload": None, "budget": {"max_seeds": 10}}, "body.budget", "only a managed study"),
    ],
)
def test_bad_budgets_are_422_naming_the_field(api, change, field, needle):
    body = {**_spec(max_seeds=10), **change}
    r = api.post("/api/v1/studies", json=body)
    assert r.status_code == 422, r.text
    (d,) = r.json()["detail"]  # one refusal, at the field it is about
    assert ".".join(map(str, d["loc"])) == field and needle in d["msg"], d


def test_budget_over_the_run_cap_is_refused(make_api):
    api = make_api(max_runs_per_study=20)
    r = api.post("/api/v1/studies", json=_spec(max_seeds=30))
    assert r.status_code == 422
    (d,) = r.json()["detail"]
    assert d["loc"] == ["body", "budget", "max_seeds"] and "limit of 20" in d["msg"]


def test_max_runs_caps_the_seeds():
    from steady.server.studies.adaptive import planned_sizes
    from steady.server.studies.schemas import StudySpec

    spec = StudySpec.model_validate({**_spec(max_seeds=30, max_runs=26), "determinism": ["seeded", "strict"]})
    assert spec.runs_per_seed == 2 and spec.max_seeds == 13 and planned_sizes(spec) == (5, 10, 13)


# --------------------------------------------------------------------------- stack portability in stages


def _port_final(seed: int, stack: str, sd: float) -> float:
    return float(sd * np.random.default_rng((1000 if stack == "old" else 2000) + seed).standard_normal())


def test_inconclusive_portability_grows_until_equivalent(api):
    """A two-stack upgrade comparison with a margin and no max_std: the group-sequential TOST is
    inconclusive at 5 and 10 seeds per stack, so the server adds seeds until it is `equivalent`."""
    from steady.server.stats.sequential_tost import sequential_tost_decision

    spec = {"name": "upgrade", "workload": {"framework": "torch", "name": "torch_mlp"}, "seeds": [0, 1, 2, 3, 4],
            "determinism": ["seeded"], "stacks": [{"name": "old"}, {"name": "new"}], "reference_stack": "old",
            "metrics": [{"name": "loss", "margin": 0.5}], "budget": {"max_seeds": 30, "stage_seeds": 5}}
    r = api.post("/api/v1/studies", json=spec)
    assert r.status_code == 201, r.text
    sid, wid, seen = r.json()["id"], register(api), []
    while (leased := lease(api, wid)) is not None:
        lid, run_id, seed, stack = (leased["lease_id"], leased["run_id"], leased["spec"]["seed"],
                                    leased["spec"]["stack"])
        body = batch(lid, 0, "loss", [0, 1], [1.0, _port_final(seed, stack, 0.4)])
        assert api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=body).status_code == 200
        assert api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid)).status_code == 200
        seen.append((seed, stack))
    assert sorted(seen) == sorted((s, k) for s in range(15) for k in ("old", "new"))  # 3 stages of 5 seeds
    study = api.get(f"/api/v1/studies/{sid}").json()
    assert study["status"] == "completed" and study["stage"]["stage"] == 3
    report = api.get(f"/api/v1/studies/{sid}/report").json()
    assert [s["outcome"] for s in report["stages"]] == ["continue", "continue", "conclusive"]
    (v,) = [v for v in report["verdicts"] if v["level"] == "stack_portability"]
    assert v["verdict"] == "equivalent" and v["sequential"]["decided_at"] == 3 and v["n_reference"] == 15
    assert "equivalent within ±0.5 at stage 3 with 15 + 15 seeds" in v["reason"]
    assert "over all stages" in v["guarantee"]
    # the stages' boundaries, CIs and decisions are those of the pure sequential TOST on the same values
    ref = sequential_tost_decision([[_port_final(s, "old", 0.4) for s in range(5 * j, 5 * j + 5)] for j in range(3)],
                                   [[_port_final(s, "new", 0.4) for s in range(5 * j, 5 * j + 5)] for j in range(3)],
                                   margin=0.5, max_seeds=30, last_stage=6)
    decisions = [d for s in report["stages"] for d in s["decisions"]]
    assert all(d["level"] == "stack_portability" and d["candidate_stack"] == "new" for d in decisions)
    assert [d["boundary"] for d in decisions] == pytest.approx([look.boundary for look in ref.stages])
    assert [d["ci_high"] for d in decisions] == pytest.approx([look.ci_high for look in ref.stages])
    assert [d["decision"] for d in decisions] == ["inconclusive", "inconclusive", "equivalent"]
    text = render_report(Report.model_validate(report))
    assert "Adaptive seeds — stage 3 of at most 6" in text and "loss  seeded / new vs old: n=15+15" in text
    page = api.get(f"/studies/{sid}")
    assert page.status_code == 200 and page.text.count('data-stage="') == 3 and "new vs old" in page.text
    assert "15 + 15" in page.text and "Δmean" in page.text


def test_budget_with_a_margin_needs_two_stacks(api):
    body = {**_spec(max_seeds=10), "metrics": [{"name": "loss", "margin": 0.5}]}
    r = api.post("/api/v1/studies", json=body)
    assert r.status_code == 422 and "two or more stacks" in r.text
    ok = {**body, "stacks": [{"name": "a"}, {"name": "b"}]}
    assert api.post("/api/v1/studies", json=ok).status_code == 201
