import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.regression.mixed_linear_model import MixedLM
from statsmodels.stats.power import TTestIndPower

from steady.server.stats.cost import balanced_level_order, cost_ratio, cost_verdict, run_summary
from steady.server.stats.intervals import normal_tolerance_factor
from steady.server.stats.planning import (seeds_for_difference, seeds_for_equivalence, seeds_for_std_claim,
                                seeds_for_tolerance_halfwidth)
from steady.server.stats.seed_stability import seed_spread
from steady.server.stats.variance import variance_components


def test_variance_components_unbalanced_by_hand():
    vc = variance_components([[1, 2, 3], [4, 6], [5]])
    # MSB = 13.5/2, MSW = 4/3, n0 = (6 - 14/6)/2 = 11/6
    assert vc.ms_between == pytest.approx(6.75) and vc.ms_within == pytest.approx(4 / 3)
    assert vc.n0 == pytest.approx(11 / 6)
    assert vc.between == pytest.approx((6.75 - 4 / 3) / (11 / 6))
    assert vc.share_between + vc.share_within == pytest.approx(1.0)


def test_variance_components_balanced_match_mixedlm_reml():
    rng = np.random.default_rng(4)
    seeds = np.repeat(np.arange(8), 4)
    y = 1.0 + rng.normal(0, 0.5, 8)[seeds] + rng.normal(0, 0.2, seeds.size)
    vc = variance_components([y[seeds == s] for s in range(8)])
    fit = MixedLM(y, np.ones((y.size, 1)), groups=seeds).fit(reml=True)
    assert vc.within == pytest.approx(fit.scale, rel=1e-3)
    assert vc.between == pytest.approx(float(np.asarray(fit.cov_re)[0, 0]), rel=1e-3)


def test_variance_components_truncate_and_validate():
    vc = variance_components([[1.0, 2.0], [1.1, 1.9], [1.5, 1.5]])
    assert vc.between == 0.0 and vc.share_within == 1.0
    with pytest.raises(ValueError):
        variance_components([[1.0], [2.0]])
    with pytest.raises(ValueError, match="NaN"):
        variance_components([[1.0, np.nan], [2.0, 3.0]])


def test_cost_ratio_by_hand_matches_scipy_welch_on_log_medians():
    strict = [np.array([2.0, 2.0, 9.0]), np.array([4.0, 4.0, 0.1]), np.array([3.0])]  # medians 2, 4, 3
    none = [np.array([1.0]), np.array([2.0, 2.0]), np.array([1.5, np.nan])]  # medians 1, 2, 1.5
    a = cost_ratio(strict, none, warmup_fraction=0.0)
    assert a.ratio == pytest.approx(2.0) and a.design == "independent"
    ref = stats.ttest_ind(np.log([2, 4, 3]), np.log([1, 2, 1.5]), equal_var=False).confidence_interval(0.95)
    assert (a.ci_low, a.ci_high) == pytest.approx((math.exp(ref.low), math.exp(ref.high)))
    assert a.verdict is None and a.budget is None and "95% CI" in a.guarantee
    gen = np.random.default_rng(0)
    s5 = [gen.gamma(20, 0.015, 50) for _ in range(5)]
    n3 = [gen.gamma(20, 0.01, 50) for _ in range(3)]
    x = cost_ratio(s5, n3, confidence=0.9, warmup_fraction=0.0)
    ls, ln = np.log([np.median(r) for r in s5]), np.log([np.median(r) for r in n3])
    ref = stats.ttest_ind(ls, ln, equal_var=False).confidence_interval(0.9)
    assert (x.ci_low, x.ci_high) == pytest.approx((math.exp(ref.low), math.exp(ref.high)))
    assert x.ratio == pytest.approx(math.exp(ls.mean() - ln.mean()))
    single = cost_ratio([np.array([3.0])], none)
    assert single.ci_low is None and single.ratio == pytest.approx(3.0 / math.exp(np.log([1, 2, 1.5]).mean()))
    assert cost_ratio([np.array([3.0])], none, budget=1.5).verdict == "inconclusive"


def test_cost_ratio_paired_matches_scipy_ttest_rel():
    gen = np.random.default_rng(3)
    machine = np.exp(gen.normal(0, 0.3, 4))  # what the two runs of a pair share
    strict = [m * 1.2 * gen.gamma(50, 0.02, 40) for m in machine]
    seeded = [m * gen.gamma(50, 0.02, 40) for m in machine]
    p = cost_ratio(strict, seeded, paired=True, warmup_fraction=0.0)
    d = np.log([np.median(r) for r in strict]) - np.log([np.median(r) for r in seeded])
    ref = stats.ttest_rel(np.log([np.median(r) for r in strict]), np.log([np.median(r) for r in seeded]))
    lo, hi = ref.confidence_interval(0.95)
    assert p.design == "paired" and p.df == 3 and p.ratio == pytest.approx(math.exp(d.mean()))
    assert (p.ci_low, p.ci_high) == pytest.approx((math.exp(lo), math.exp(hi)))
    welch = cost_ratio(strict, seeded, warmup_fraction=0.0)
    assert p.ci_high / p.ci_low < welch.ci_high / welch.ci_low  # pairing removes the machine effect
    with pytest.raises(ValueError, match="same number"):
        cost_ratio(strict, seeded[:3], paired=True)


def test_cost_ratio_drops_warmup_steps():
    run = np.r_[np.full(10, 5.0), np.full(90, 1.0)]  # 10 slow warm-up steps of 100
    assert run_summary(run) == 1.0  # first ceil(10%) = 10 steps dropped
    assert run_summary(run, warmup_fraction=0.0) == 1.0  # the median already ignores them here ...
    short = np.array([9.0, 1.0, 1.0, 2.0])
    assert run_summary(short) == 1.0 and run_summary(short, warmup_fraction=0.0) == 1.5  # ... not here
    assert run_summary(np.array([4.0])) == 4.0 and run_summary(np.array([np.nan])) is None


def test_cost_ratio_degenerate_inputs_are_exact():
    same = [np.full(30, 0.02), np.full(30, 0.02), np.full(30, 0.02)]
    c = cost_ratio(same, same)
    assert (c.ratio, c.ci_low, c.ci_high) == (1.0, 1.0, 1.0)
    slower = [np.full(30, 0.03)] * 3
    d = cost_ratio(slower, same, budget=1.4)
    assert d.ratio == pytest.approx(1.5) and d.ci_low == d.ci_high == d.ratio and d.verdict == "fail"
    p = cost_ratio(slower, same, paired=True, budget=1.6)
    assert p.ci_low == p.ci_high == p.ratio and p.verdict == "pass"
    for bad in (1.0, 0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="budget"):
            cost_ratio(slower, same, budget=bad)
    with pytest.raises(ValueError, match="> 0"):
        cost_ratio([np.zeros(5)] * 2, same)


def test_cost_verdict_against_budget():
    assert cost_verdict(1.1, 1.4, 1.5) == "pass"
    assert cost_verdict(1.1, 1.5, 1.5) == "pass"
    assert cost_verdict(1.6, 1.9, 1.5) == "fail"
    assert cost_verdict(1.5, 1.9, 1.5) == "inconclusive"
    assert cost_verdict(1.2, 1.9, 1.5) == "inconclusive"
    assert cost_verdict(None, None, 1.5) == "inconclusive" and cost_verdict(1.0, 2.0, None) is None


def test_balanced_level_order_interleaves_and_alternates():
    order = balanced_level_order(["none", "seeded", "strict"], 3)
    assert order == [["none", "seeded", "strict"], ["strict", "seeded", "none"], ["none", "seeded", "strict"]]
    flat = [lv for block in balanced_level_order(["a", "b"], 4) for lv in block]
    pos = {lv: [i for i, x in enumerate(flat) if x == lv] for lv in "ab"}
    assert np.mean(pos["a"]) == np.mean(pos["b"])  # a linear drift cancels over pairs of blocks


@pytest.mark.parametrize("d,alpha,power", [(0.5, 0.05, 0.8), (1.0, 0.05, 0.9), (2.0, 0.01, 0.8), (0.3, 0.1, 0.8)])
def test_seeds_for_difference_matches_statsmodels(d, alpha, power):
    ref = TTestIndPower().solve_power(effect_size=d, alpha=alpha, power=power)
    assert seeds_for_difference(d * 2.0, 2.0, alpha=alpha, power=power) == math.ceil(ref)


def test_seeds_for_tolerance_halfwidth():
    n = seeds_for_tolerance_halfwidth(1.0, 3.0, coverage=0.9, confidence=0.95)
    assert normal_tolerance_factor(n, coverage=0.9, confidence=0.95) <= 3.0
    assert normal_tolerance_factor(n - 1, coverage=0.9, confidence=0.95) > 3.0
    assert seeds_for_tolerance_halfwidth(1.0, 1.6, coverage=0.9, confidence=0.95) is None  # < z_0.95


def test_seeds_for_difference_finds_answers_above_the_last_power_of_two():
    # True answer between 65,537 and 100,000: the old doubling search jumped from 65,536 to
    # 131,072 > MAX_SEEDS and answered "no feasible number".
    d = 0.0147
    ref = math.ceil(TTestIndPower().solve_power(effect_size=d, alpha=0.05, power=0.8))
    assert 65_537 <= ref <= 100_000
    assert seeds_for_difference(d, 1.0) == ref
    assert seeds_for_difference(0.005, 1.0) is None  # ~628,000: beyond MAX_SEEDS


def _power_by_simulation(n, sigma, max_std, alpha, reps, gen):
    # Independent of planning.py: draw n normal values, form the chi-square upper bound directly.
    x = gen.normal(0.0, sigma, (reps, n))
    s2 = x.var(axis=1, ddof=1)
    upper = np.sqrt((n - 1) * s2 / stats.chi2.ppf(alpha, n - 1))
    return float(np.mean(upper < max_std))


def test_seeds_for_std_claim_states_its_alternative_and_has_the_power():
    plan = seeds_for_std_claim(0.4, 0.5, alpha=0.05)
    assert "to show σ < 0.5 when the true σ is 0.4 (0.8·max_std)" in plan.text and "power 80%" in plan.text
    assert plan.text.startswith("to show") and f"~{plan.n} seeds" in plan.text
    gen = np.random.default_rng(11)
    assert _power_by_simulation(plan.n, 0.4, 0.5, 0.05, 20_000, gen) >= 0.8 - 3 * math.sqrt(0.16 / 20_000)
    assert _power_by_simulation(plan.n - 5, 0.4, 0.5, 0.05, 20_000, gen) < 0.8
    # The exact power function by another route: P(s² < max² χ²_{α,n−1}/(n−1)) via the gamma law of s².
    n = plan.n
    crit = 0.25 * stats.chi2.ppf(0.05, n - 1) / (n - 1)
    power = lambda m, c: stats.gamma.cdf(c, a=(m - 1) / 2, scale=2 * 0.16 / (m - 1))  # noqa: E731
    assert power(n, crit) >= 0.8 > power(n - 1, 0.25 * stats.chi2.ppf(0.05, n - 2) / (n - 2))
    up = seeds_for_std_claim(0.625, 0.5)
    assert "σ > 0.5" in up.text and up.n > 5
    assert seeds_for_std_claim(0.0, 1.0).n == 2
    with pytest.raises(ValueError, match="limit itself"):
        seeds_for_std_claim(1.0, 1.0)


def test_seeds_for_equivalence_plans_for_a_stated_difference():
    plan = seeds_for_equivalence(0.0, 1.0, 0.5)
    assert "to show |Δ| < 0.5 when the true Δ is 0 and σ = 1" in plan.text and plan.unit == "seeds per stack"
    assert seeds_for_equivalence(0.0, 1.0, 0.5).n > seeds_for_equivalence(0.0, 1.0, 1.0).n > 2
    assert seeds_for_equivalence(0.2, 1.0, 0.5).n > plan.n
    with pytest.raises(ValueError, match="inside the margin"):
        seeds_for_equivalence(0.6, 1.0, 0.5)


def test_seed_spread_verdicts():
    rng = np.random.default_rng(8)
    tight = rng.normal(0, 0.1, 20)
    assert seed_spread(tight, max_std=0.5).verdict == "stable"
    assert seed_spread(rng.normal(0, 2.0, 20), max_std=0.5).verdict == "unstable"
    few = seed_spread(tight[:3], max_std=0.5)
    assert few.verdict == "inconclusive" and few.n_needed >= 5 and "only 3 seeds" in few.reason
    close = seed_spread(rng.normal(0, 0.5, 6), max_std=0.5)
    assert close.verdict == "inconclusive" and close.n_needed > 6
    assert "indistinguishable from the limit at this precision" in close.reason
    assert "when the true σ is" in close.reason and f"~{close.n_needed} seeds" in close.reason
    near = seed_spread(np.array([-1.0, 1.0] * 3) * 0.4999 / np.std([-1.0, 1.0] * 3, ddof=1), max_std=0.5)
    assert near.std == pytest.approx(0.4999) and near.n_needed < 1000  # not a five-digit plug-in answer
    nolimit = seed_spread(tight)
    assert nolimit.verdict == "inconclusive" and "no max_std" in nolimit.reason
    assert nolimit.tolerance.k == pytest.approx(normal_tolerance_factor(20, coverage=0.9, confidence=0.95))
    with pytest.raises(ValueError, match="NaN"):
        seed_spread([1.0, np.inf, 2.0])
