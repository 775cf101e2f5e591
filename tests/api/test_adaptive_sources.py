"""A sources study with a budget over REST: its arms grow in stages until each source's TOST of SDs decides;
a decided source's arm stops growing, the undecided ones and the all-sources arm go on, and the verdicts are
those of the pure group-sequential rule (steady.server.stats.sequential_sources) on the same values."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from steady.server.cli.render import render_report, sources_lines
from steady.server.reports.models import Report
from steady.server.stats.sequential import stage_sizes
from steady.server.stats.sequential_sources import sequential_sd_ratio_tost
from tests.api.helpers import batch, lease, register, result
from tests.conftest import SQLITE_ONLY

SD = {"none": 0.0, "init": 1.0, "data": 0.02, "all": 1.0}  # data order adds (almost) nothing here


def _final(arm: str, seed: int) -> float:
    rng = np.random.default_rng(zlib.crc32(f"{arm}/{seed}".encode()))
    return float(SD[arm] * rng.standard_normal())


def _spec(**budget) -> dict:
    return {"name": "where-from, in stages", "workload": {"framework": "python", "name": "numpy_sources"},
            "seeds": list(range(10)), "determinism": ["seeded"], "metrics": ["val_loss"],
            "sources": {"vary": ["init", "data"], "margin": 2.0}, "budget": budget}


def _work(api, wid: int) -> list[tuple[str, int]]:
    """Run every queued run (its arm's final value at step 1); returns (arm, seed) in the order run."""
    done = []
    while (leased := lease(api, wid)) is not None:
        lid, run_id, spec = leased["lease_id"], leased["run_id"], leased["spec"]
        arm = {"init,data": "all"}.get(spec["params"]["sources"], spec["params"]["sources"])
        body = batch(lid, 0, "val_loss", [0, 1], [2.0, _final(arm, spec["seed"])])
        assert api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=body).status_code == 200
        exposed = {"level": "seeded", "sources_exposed": ["data", "dropout", "init", "numerics", "ulp"]}
        assert api.post(f"/api/v1/runs/{run_id}/complete", role="worker",
                        json=result(lid, determinism_applied=exposed)).status_code == 200
        done.append((arm, spec["seed"]))
    return done


def test_a_sources_study_grows_only_its_undecided_arms(api):
    sid = api.post("/api/v1/studies", json=_spec(max_seeds=60, stage_seeds=10)).json()["id"]
    done = _work(api, register(api, labels=("python", "cpu")))
    by_arm: dict[str, list[int]] = {}
    for arm, seed in done:
        by_arm.setdefault(arm, []).append(seed)
    # the data arm is decided at stage 1 (its SD is a fiftieth of all sources'): it never grows
    assert sorted(by_arm["data"]) == list(range(10)) and sorted(by_arm["none"]) == list(range(10))
    report = Report.model_validate(api.get(f"/api/v1/studies/{sid}/report").json())
    (table,) = report.sources
    rows = {r.source: r for r in table.rows}
    data, init = rows["data"].sequential, rows["init"].sequential
    assert data is not None and data.verdict == "not_equivalent" and data.decided_at == 1
    assert rows["data"].vs_all is not None and rows["data"].vs_all.verdict == "not_equivalent"
    # the init arm and the all-sources arm grew together, stage by stage, until init decided or the budget ended
    n = len(by_arm["init"])
    assert sorted(by_arm["init"]) == sorted(by_arm["all"]) == list(range(n)) and n > 10
    assert init is not None and len(init.looks) == n // 10
    # the same verdict and boundaries as the pure rule on the same values
    x = np.array([_final("init", s) for s in range(n)])
    y = np.array([_final("all", s) for s in range(n)])
    sizes = stage_sizes(10, 10, 60)
    cut = [k for k in sizes[:-1] if k < n]
    ref = sequential_sd_ratio_tost(np.split(x, cut), np.split(y, cut), max_runs=60, last_stage=len(sizes), margin=2.0)
    assert init.verdict == ref.verdict and init.decided_at == ref.decided_at
    assert [look.boundary for look in init.looks] == pytest.approx([look.boundary for look in ref.stages])
    assert init.verdict == "equivalent" or (init.final and n == 60)
    # each stage records its decisions per source; later stages name only the sources still growing
    stages = report.stages
    assert {d.candidate_stack for d in stages[0].decisions if d.level == "sources"} == {"init", "data"}
    assert all({d.candidate_stack for d in s.decisions if d.level == "sources"} >= {"init"} for s in stages)
    assert stages[-1].outcome in ("conclusive", "budget_spent") and len(stages) == n // 10
    assert sorted(stages[1].seeds) == list(range(10, 20))
    # shown as a user reads it
    text = "\n".join(sources_lines(report))
    assert "in stages: arms grow until each source's TOST decides" in text
    assert "NOT the full variance at stage 1 (10 + 10 runs)" in text
    assert "init vs all: n=10+10" in render_report(report)
    page = api.get(f"/studies/{sid}")
    assert page.status_code == 200 and "SD ratio" in page.text  # the stages table
    # the study page's sources table: a row per source, the verdict and where the stages stopped
    assert 'data-sources="val_loss"' in page.text and 'data-source="all"' in page.text
    assert "not equivalent, wholly outside ×2 at stage 1 with 10 + 10 runs" in page.text


@SQLITE_ONLY  # pydantic validation: the same on both backends
def test_a_sources_study_may_carry_a_budget_without_max_std_or_margin(api):
    assert api.post("/api/v1/studies", json=_spec(max_seeds=30)).status_code in (200, 201)
    bare = _spec(max_seeds=30)
    del bare["sources"]
    r = api.post("/api/v1/studies", json=bare)
    assert r.status_code == 422 and "no verdict can become conclusive" in r.text


@SQLITE_ONLY  # the time check is Python's; leasing and judging are covered on both above
def test_a_time_budget_ends_the_study_and_marks_its_undecided_sources_stopped(api):
    """``budget.max_minutes``: no next stage is queued that would end past it, at the pace of the stage just run.
    The budget here (6 ms) is below any stage's time, so stage 1 is the last: what it decided stands, and each
    source it left undecided is reported as stopped by the time budget, not as "more runs come"."""
    sid = api.post("/api/v1/studies", json=_spec(max_seeds=60, stage_seeds=10, max_minutes=1e-4)).json()["id"]
    done = _work(api, register(api, labels=("python", "cpu")))
    assert {s for _, s in done} == set(range(10))  # no second stage
    assert api.get(f"/api/v1/studies/{sid}").json()["status"] == "completed"
    report = Report.model_validate(api.get(f"/api/v1/studies/{sid}/report").json())
    assert [s.outcome for s in report.stages] == ["time_spent"]
    rows = {r.source: r.sequential for r in report.sources[0].rows}
    data, init = rows["data"], rows["init"]
    assert data is not None and data.verdict == "not_equivalent" and data.decided_at == 1 and not data.stopped
    # the same stage-1 look as the pure rule with the planned boundaries: stopping spends no more error
    x, y = (np.array([_final(a, s) for s in range(10)]) for a in ("init", "all"))
    ref = sequential_sd_ratio_tost([x], [y], max_runs=60, last_stage=6, margin=2.0)
    assert init is not None and init.verdict == ref.verdict == "inconclusive"
    assert init.looks[0].boundary == pytest.approx(ref.stages[0].boundary) and not ref.final
    assert init.final and init.stopped and "stopped by the study's time budget" in init.reason
    text = "\n".join(sources_lines(report))
    assert "at stage 1 (10 + 10 runs); stopped by the time budget" in text and "more runs come" not in text
    page = api.get(f"/studies/{sid}")
    assert "time budget spent" in page.text and "data-time-spent" in page.text
    assert "stopped by the study&#39;s time budget before the budget&#39;s last stage" in page.text


@SQLITE_ONLY  # the seeds a stage adds are chosen in Python; leasing is covered on both above
def test_a_repeated_study_on_fresh_seeds_grows_into_fresh_seeds(api):
    """The next stage's seeds follow the spec's own (a study from seed 1000 does not reuse seeds 0…)."""
    spec = _spec(max_seeds=20, stage_seeds=10)
    spec["seeds"] = list(range(1000, 1010))
    spec["sources"]["margin"] = 1.5  # at 10 runs per arm no source can be shown equivalent: a second stage comes
    api.post("/api/v1/studies", json=spec)
    done = _work(api, register(api, labels=("python", "cpu")))
    assert {s for _, s in done} == set(range(1000, 1020))
