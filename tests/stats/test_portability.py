import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.weightstats import ttost_ind

from steady.server.stats.portability import (adjust, band_containment, benjamini_hochberg, bootstrap_mean_diff,
                                   brown_forsythe, compare_stacks, hedges_g, holm, tost, welch)

RNG = np.random.default_rng(99)
REF = RNG.normal(1.0, 0.2, 9)
CAND = RNG.normal(1.05, 0.35, 12)


def test_welch_matches_scipy():
    r = welch(REF, CAND)
    s = stats.ttest_ind(CAND, REF, equal_var=False)
    assert r.statistic == pytest.approx(s.statistic) and r.p_value == pytest.approx(s.pvalue)


@pytest.mark.parametrize("margin", [0.05, 0.2, 0.5])
def test_tost_matches_statsmodels(margin):
    r = tost(REF, CAND, margin=margin)
    p, lower, upper = ttost_ind(CAND, REF, -margin, margin, usevar="unequal")
    assert r.p_value == pytest.approx(p)
    assert r.p_lower == pytest.approx(lower[1]) and r.p_upper == pytest.approx(upper[1])


def test_brown_forsythe_matches_scipy_levene_median():
    r = brown_forsythe(REF, CAND)
    s = stats.levene(REF, CAND, center="median")
    assert r.statistic == pytest.approx(s.statistic) and r.p_value == pytest.approx(s.pvalue)


def test_hedges_g_by_hand():
    a, b = np.array([1.0, 2.0, 3.0]), np.array([3.0, 4.0, 5.0, 6.0])
    sp = np.sqrt((2 * 1.0 + 3 * (5 / 3)) / 5)
    assert hedges_g(a, b) == pytest.approx((4.5 - 2.0) / sp * (1 - 3 / (4 * 7 - 9)))


def test_bootstrap_is_reproducible_and_seed_controlled():
    a = bootstrap_mean_diff(REF, CAND, rng=np.random.default_rng(5))
    b = bootstrap_mean_diff(REF, CAND, rng=np.random.default_rng(5))
    c = bootstrap_mean_diff(REF, CAND, rng=np.random.default_rng(6))
    assert a == b and (a.low, a.high) != (c.low, c.high)
    assert a.estimate == pytest.approx(CAND.mean() - REF.mean())
    assert a.low < a.estimate < a.high
    with pytest.raises(ValueError, match="Generator"):
        bootstrap_mean_diff(REF, CAND, rng=5)


@pytest.mark.parametrize("method,sm", [("holm", "holm"), ("bh", "fdr_bh")])
def test_multiple_comparison_matches_statsmodels(method, sm):
    p = np.array([0.001, 0.04, 0.03, 0.2, 0.04, 0.8, 0.0001, 0.5])
    np.testing.assert_allclose(adjust(p, method=method), multipletests(p, method=sm)[1])
    q = np.random.default_rng(0).uniform(size=30) ** 3
    np.testing.assert_allclose(holm(q), multipletests(q, method="holm")[1])
    np.testing.assert_allclose(benjamini_hochberg(q), multipletests(q, method="fdr_bh")[1])
    with pytest.raises(ValueError):
        adjust(p, method="bonferonni")


def test_band_containment():
    share, k = band_containment([0, 1, 5, np.nan], [-1, -1, -1, -1], [1, 1, 1, 1])
    assert k == 3 and share == pytest.approx(2 / 3)


def test_compare_stacks_uses_scipy_for_rank_tests():
    r = compare_stacks(REF, CAND, margin=0.3, rng=np.random.default_rng(0))
    assert r.mann_whitney.p_value == pytest.approx(stats.mannwhitneyu(CAND, REF).pvalue)
    assert r.ks.p_value == pytest.approx(stats.ks_2samp(REF, CAND).pvalue)
    lo, hi = stats.ttest_ind(CAND, REF, equal_var=False).confidence_interval(0.95)
    assert (r.diff_ci_low, r.diff_ci_high) == pytest.approx((lo, hi))
    with pytest.raises(ValueError, match="NaN"):
        compare_stacks([1.0, np.nan], CAND, margin=0.3, rng=np.random.default_rng(0))
