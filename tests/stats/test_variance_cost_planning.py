import math

import numpy as np
import pytest
from statsmodels.regression.mixed_linear_model import MixedLM
from statsmodels.stats.power import TTestIndPower

from app.stats.cost import cost_ratio
from app.stats.intervals import normal_tolerance_factor
from app.stats.planning import (seeds_for_difference, seeds_for_equivalence, seeds_for_std_claim,
                                seeds_for_tolerance_halfwidth)
from app.stats.seed_stability import seed_spread
from app.stats.variance import variance_components


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


def test_cost_ratio_by_hand_and_seeded():
    strict = [np.array([2.0, 2.0, 9.0]), np.array([4.0, 4.0, 0.1])]  # medians 2, 4
    none = [np.array([1.0]), np.array([2.0, 2.0])]  # medians 1, 2
    a = cost_ratio(strict, none, rng=np.random.default_rng(1))
    assert a.ratio == pytest.approx(2.0) and a.ci_low <= a.ratio <= a.ci_high
    gen = np.random.default_rng(0)
    many_s = [gen.gamma(20, 0.015, 50) for _ in range(8)]
    many_n = [gen.gamma(20, 0.01, 50) for _ in range(8)]
    x = cost_ratio(many_s, many_n, rng=np.random.default_rng(1))
    y = cost_ratio(many_s, many_n, rng=np.random.default_rng(1))
    z = cost_ratio(many_s, many_n, rng=np.random.default_rng(2))
    assert x == y and (x.ci_low, x.ci_high) != (z.ci_low, z.ci_high)
    assert x.ratio == pytest.approx(np.mean([np.median(r) for r in many_s]) / np.mean([np.median(r) for r in many_n]))
    single = cost_ratio([np.array([3.0])], none, rng=np.random.default_rng(1))
    assert single.ci_low is None and single.ratio == pytest.approx(2.0)


@pytest.mark.parametrize("d,alpha,power", [(0.5, 0.05, 0.8), (1.0, 0.05, 0.9), (2.0, 0.01, 0.8), (0.3, 0.1, 0.8)])
def test_seeds_for_difference_matches_statsmodels(d, alpha, power):
    ref = TTestIndPower().solve_power(effect_size=d, alpha=alpha, power=power)
    assert seeds_for_difference(d * 2.0, 2.0, alpha=alpha, power=power) == math.ceil(ref)


def test_seeds_for_tolerance_halfwidth():
    n = seeds_for_tolerance_halfwidth(1.0, 3.0, coverage=0.9, confidence=0.95)
    assert normal_tolerance_factor(n, coverage=0.9, confidence=0.95) <= 3.0
    assert normal_tolerance_factor(n - 1, coverage=0.9, confidence=0.95) > 3.0
    assert seeds_for_tolerance_halfwidth(1.0, 1.6, coverage=0.9, confidence=0.95) is None  # < z_0.95


def test_seeds_for_std_and_equivalence():
    from scipy import stats
    n = seeds_for_std_claim(0.5, 1.0, alpha=0.05)
    ub = lambda m: 0.5 * math.sqrt((m - 1) / stats.chi2.ppf(0.05, m - 1))  # noqa: E731
    assert ub(n) < 1.0 <= ub(n - 1)
    assert seeds_for_std_claim(1.0, 1.0) is None
    assert seeds_for_equivalence(0.6, 1.0, 0.5) is None
    assert seeds_for_equivalence(0.0, 1.0, 0.5) > seeds_for_equivalence(0.0, 1.0, 1.0) > 2


def test_seed_spread_verdicts():
    rng = np.random.default_rng(8)
    tight = rng.normal(0, 0.1, 20)
    assert seed_spread(tight, max_std=0.5).verdict == "stable"
    assert seed_spread(rng.normal(0, 2.0, 20), max_std=0.5).verdict == "unstable"
    few = seed_spread(tight[:3], max_std=0.5)
    assert few.verdict == "inconclusive" and few.n_needed >= 5 and "only 3 seeds" in few.reason
    close = seed_spread(rng.normal(0, 0.5, 6), max_std=0.5)
    assert close.verdict == "inconclusive" and (close.n_needed is None or close.n_needed > 6)
    nolimit = seed_spread(tight)
    assert nolimit.verdict == "inconclusive" and "no max_std" in nolimit.reason
    assert nolimit.tolerance.k == pytest.approx(normal_tolerance_factor(20, coverage=0.9, confidence=0.95))
    with pytest.raises(ValueError, match="NaN"):
        seed_spread([1.0, np.inf, 2.0])
