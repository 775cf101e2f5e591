"""Calibration of the determinism-cost rule and the planning answers (steady.server.stats.calibration.rules_cost).

Bounded simulation counts with fixed seeds: each healthy scenario must not exceed its nominal
false-alarm level beyond simulation error (exact one-sided binomial test at 1%), and each
planned study must reach the power it was planned for."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from steady.server.stats.calibration import Rate, clopper_pearson, exceeds_nominal, measure
from steady.server.stats.calibration.rules import all_rules, rule_by_name
from steady.server.stats.calibration.rules_cost import RULES, queue_positions, simulate_step_times
from steady.server.stats.cost import cost_ratio

HEALTHY = [(rule, s) for rule in RULES for s in rule.scenarios if s.kind == "healthy"]


def test_cost_rules_are_registered():
    names = {r.name for r in all_rules()}
    assert {"cost.ratio_ci", "cost.budget_fail", "cost.budget_pass", "planning.std_claim",
            "planning.equivalence"} <= names
    for rule in RULES:
        assert {s.kind for s in rule.scenarios} == {"healthy", "planted"}, rule.name


@pytest.mark.parametrize(("rule", "scenario"), HEALTHY, ids=[f"{r.name}:{s.name}" for r, s in HEALTHY])
def test_healthy_false_alarm_rate_within_nominal(rule, scenario):
    rate = measure(rule, scenario, n=600, rng=np.random.default_rng(20261129))
    assert not exceeds_nominal(rate), f"{rule.name}/{scenario.name}: {rate.k}/{rate.n} > nominal {rule.nominal}"


def test_identical_levels_with_three_runs_cover_one_at_the_nominal_rate():
    """The issue's acceptance check: 3 runs per level, identical levels, 95% CI covers 1.0."""
    rng = np.random.default_rng(5)
    n, covered = 1000, 0
    for _ in range(n):
        t = simulate_step_times(rng, n_per_level=3, drift=0.0)
        c = cost_ratio(t["strict"], t["seeded"])
        covered += c.ci_low <= 1.0 <= c.ci_high
    # H0: coverage >= 0.95 is not rejected at the 1% level (exact binomial)
    assert stats.binom.cdf(covered, n, 0.95) > 0.01, covered


def _at_least_power(rate: Rate, power: float) -> bool:
    """The planted firing rate is not below ``power`` beyond simulation error (exact binomial, 1%)."""
    return float(stats.binom.cdf(rate.k, rate.n, power)) > 0.01


@pytest.mark.parametrize(("rule_name", "scenario_name", "power"), [
    ("planning.std_claim", "sigma_at_alternative", 0.8),
    ("planning.equivalence", "diff_zero", 0.8),
    ("cost.ratio_ci", "strict_1.3x_3_interleaved", 0.75),
    ("cost.budget_fail", "twice_budget_3", 0.85),
    ("cost.budget_pass", "free_3", 0.95),
])
def test_planted_scenarios_reach_their_power(rule_name, scenario_name, power):
    rule = rule_by_name(rule_name)
    (scenario,) = [s for s in rule.scenarios if s.name == scenario_name]
    rate = measure(rule, scenario, n=600, rng=np.random.default_rng(4))
    assert _at_least_power(rate, power), f"{rule_name}/{scenario_name}: {rate.k}/{rate.n} below {power}"


def test_queue_orders():
    assert queue_positions(["a", "b"], 3, "blocked") == {"a": [0, 1, 2], "b": [3, 4, 5]}
    assert queue_positions(["a", "b"], 3, "interleaved") == {"a": [0, 3, 4], "b": [1, 2, 5]}
    with pytest.raises(ValueError):
        queue_positions(["a"], 1, "random")


def test_blocked_order_reads_load_drift_as_cost_interleaved_does_not():
    """Why runs are now created interleaved: with a 15% load drift over the study, running every
    run of one level as a block makes identical levels look different; interleaving holds."""
    n = 400
    miss = {}
    for order in ("blocked", "interleaved"):
        rng = np.random.default_rng(9)
        k = 0
        for _ in range(n):
            t = simulate_step_times(rng, n_per_level=5, order=order, drift=0.15)
            c = cost_ratio(t["strict"], t["seeded"])
            k += not (c.ci_low <= 1.0 <= c.ci_high)
        miss[order] = k
    low_blocked, _ = clopper_pearson(miss["blocked"], n)
    assert low_blocked > 0.2, miss  # far above the nominal 5%
    assert stats.binom.sf(miss["interleaved"] - 1, n, 0.05) > 0.01, miss
