"""The bisect page (``/bisects/GOOD..BAD``) read from studies as ``steady bisect`` writes them: each point's state
from its study's check, and the level the points were judged at with the bound it gives the answer."""
from __future__ import annotations

from typing import Any
from collections.abc import Callable

import numpy as np
import pytest

from steady.server.stats.bisect import checks_per_point, plan, wrong_point_bound
from tests.conftest import SQLITE_ONLY

pytestmark = SQLITE_ONLY

SPAN = "env-a..env-c"
SPREAD = {0: 0.001, 1: 0.001, 2: 0.3}  # the final value's SD across seeds at each point: max_std 0.05


def bisect_studies(post: Callable[..., Any], alpha: float) -> list[int]:
    """Three points of a seed-stability stack bisect, as the CLI names and describes them, judged at ``alpha``:
    stable, stable, unstable (12 seeds each)."""
    ids = []
    for point, (stack, sd) in enumerate(zip(("env-a", "env-b", "env-c"), SPREAD.values())):
        r = post("/api/v1/studies", json={
            "name": f"tiny @ {stack} (bisect {SPAN})", "kind": "external", "alpha": alpha,
            "description": f"steady bisect {SPAN} (seed-stability): point {point} of 2, stack {stack}",
            "metrics": [{"name": "loss", "max_std": 0.05}]})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        finals = 1.0 + sd * np.random.default_rng(point).standard_normal(12)
        for seed, final in enumerate(finals):
            run = {"seed": seed, "determinism": "seeded", "stack": {"name": stack},
                   "metrics": {"loss": {"steps": [0, 1], "values": [2.0, float(final)]}}}
            assert post(f"/api/v1/studies/{sid}/runs", json=run).status_code == 201
        ids.append(sid)
    return ids


def test_the_page_states_the_points_level_and_the_bound(api):
    p = plan(3, budget_runs=400, alpha=0.05)  # the ends and one round: 3 points
    ids = bisect_studies(api.post, p.alpha_point)
    page = api.get(f"/bisects/{SPAN}")
    assert page.status_code == 200, page.text
    assert "First stack where seed-stability changed: <strong><code>env-c</code></strong>" in page.text
    for point, sid in enumerate(ids):
        assert f'<tr data-point="{point}"' in page.text and f"study {sid}" in page.text
    # each point's line states the confidence its own level gives, not the report's default
    assert page.text.count(f"below it with {(1 - p.alpha_point) * 100:.3g}% confidence") == 2
    assert page.text.count(f"above it with {(1 - p.alpha_point) * 100:.3g}% confidence") == 1
    bound = wrong_point_bound(3, p.alpha_point)
    assert bound == pytest.approx(p.alpha)
    assert (f"Each point was judged at level {p.alpha_point * 100:.3g}% (its study's alpha, over its checks); with 3 "
            f"points decided, "
            f"the answer is wrong with probability ≤ {bound * 100:.3g}% (Bonferroni).") in page.text


@pytest.mark.parametrize(("kind", "levels"), [("seed_stability", ["seeded", "strict"]),
                                              ("determinism_cost", ["none", "seeded", "strict"])])
def test_a_points_checks_are_those_the_report_judges(api, kind, levels):
    """The bisect divides a point's level over its study's checks of the bisected kind: as many as the report's
    outcome judges (here 2 metrics with a max_std or a cost budget, the spec's levels, 2 stacks)."""
    spec = {"name": "checks", "kind": "external", "determinism": levels, "stacks": [{"name": "a"}, {"name": "b"}],
            "metrics": [{"name": "loss", "max_std": 0.05}, {"name": "acc", "max_std": 0.05}, {"name": "lr"}],
            "cost_budget": 1.5}
    sid = api.post("/api/v1/studies", json=spec).json()["id"]
    rng = np.random.default_rng(7)
    for stack in ("a", "b"):
        for level in levels:
            for seed in range(6):
                run = {"seed": seed, "determinism": level, "stack": {"name": stack},
                       "metrics": {key: {"steps": [0, 1], "values": [2.0, float(1 + 0.01 * rng.standard_normal())]}
                                   for key in ("loss", "acc", "lr")}
                       | {"step_time": {"steps": list(range(10)), "values": [float(1 + 0.1 * rng.random())] * 10}}}
                assert api.post(f"/api/v1/studies/{sid}/runs", json=run).status_code == 201
    outcome = api.get(f"/api/v1/studies/{sid}/report").json()["outcome"]
    judged = [c for c in outcome["checks"] if c["kind"] == kind and c["status"] != "not_asked"]
    stored = api.get(f"/api/v1/studies/{sid}").json()["spec"]
    assert len(judged) == checks_per_point(kind, stored) == (2 * 2 * 2 if kind == "seed_stability" else 3 * 2)
