"""The sources table's statistics (steady.server.stats.sources) against independent references and simulation."""
from __future__ import annotations

import zlib

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.formula.api import ols
from statsmodels.stats.anova import anova_lm

from steady.server.stats.sources import (SD_MARGIN, crossed_components, runs_for_equivalence, sd_ratio_tost,
                                         source_row, ulp_divergence)


def test_ratio_interval_matches_the_f_interval_on_normal_data():
    """Without the inflation, Bonett's interval of σₓ/σᵧ is the normal-theory F interval on normal data."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(0, 2.0, 400), rng.normal(0, 1.0, 300)
    r = sd_ratio_tost(x, y, alpha=0.05, kurtosis_inflation=1.0, kurtosis_floor=0.0)
    v = x.var(ddof=1) / y.var(ddof=1)
    f_lo = np.sqrt(v / stats.f.ppf(0.95, x.size - 1, y.size - 1))
    f_hi = np.sqrt(v / stats.f.ppf(0.05, x.size - 1, y.size - 1))
    assert r.ratio == pytest.approx(np.sqrt(v))
    assert r.lower == pytest.approx(f_lo, rel=0.03) and r.upper == pytest.approx(f_hi, rel=0.03)
    assert r.verdict == "not_equivalent"  # 2 is outside [1/1.5, 1.5] and the interval shows it


def _draw(rng, kind, shape):
    if kind == "normal":
        return rng.standard_normal(shape)
    if kind == "t5":  # heavy tails (kurtosis 9)
        return rng.standard_t(5, shape)
    if kind == "gamma":  # skewed
        return rng.gamma(2.0, size=shape)
    return rng.lognormal(0.0, 0.5, shape)  # skewed, heavy right tail


@pytest.mark.parametrize("kind,na,nb", [("normal", 30, 30), ("t5", 100, 100), ("gamma", 100, 100),
                                        ("lognormal", 20, 60)])
def test_false_equivalent_stays_at_or_below_alpha_at_the_margin(kind, na, nb):
    """A source whose SD is exactly at the margin (1.5× or 1/1.5× the all-sources SD) is called equivalent
    at most α = 5% of the time: heavy-tailed, skewed and unequal arms included."""
    rng = np.random.default_rng(zlib.crc32(f"{kind}/{na}/{nb}".encode()))  # the same draws in every process
    reps = 1500
    hits = 0
    for side in (SD_MARGIN, 1 / SD_MARGIN):
        xs, ys = _draw(rng, kind, (reps, na)) * side, _draw(rng, kind, (reps, nb))
        hits += sum(sd_ratio_tost(x, y).verdict == "equivalent" for x, y in zip(xs, ys))
    # at most 5%, with room only for Monte-Carlo error (one-sided 99.9% binomial bound)
    assert hits <= stats.binom.ppf(0.999, 2 * reps, 0.05)


def test_equal_sds_are_found_equivalent_with_enough_runs():
    rng = np.random.default_rng(5)
    reps = 300
    xs, ys = rng.standard_normal((reps, 100)), rng.standard_normal((reps, 100))
    rate = np.mean([sd_ratio_tost(x, y).verdict == "equivalent" for x, y in zip(xs, ys)])
    assert rate > 0.85
    planned = runs_for_equivalence(1.0)  # 80% power at a true ratio of 1 (normal arms)
    assert planned is not None
    xs, ys = rng.standard_normal((reps, planned)), rng.standard_normal((reps, planned))
    power = np.mean([sd_ratio_tost(x, y).verdict == "equivalent" for x, y in zip(xs, ys)])
    assert 0.72 <= power <= 0.9  # 80% up to Monte-Carlo error: the plan neither misses nor wastes runs
    assert runs_for_equivalence(1.6) is None  # outside the margin: no n shows equivalence


def test_a_zero_sd_source_is_not_equivalent_and_not_a_crash():
    r = sd_ratio_tost(np.ones(10), np.arange(10.0))
    assert r.verdict == "not_equivalent" and r.ratio == 0.0
    row = source_row("numerics", np.ones(10), np.arange(10.0))
    assert row.sd == 0.0 and row.vs_all is not None and row.vs_all.verdict == "not_equivalent"


def test_crossed_mean_squares_match_statsmodels_two_way_anova():
    rng = np.random.default_rng(11)
    i, j = 5, 4
    y = rng.normal(0, 1.0, (i, 1)) + rng.normal(0, 0.5, (1, j)) + rng.normal(0, 0.3, (i, j))
    c = crossed_components(y)
    df = pd.DataFrame({"y": y.ravel(), "a": np.repeat(np.arange(i), j), "b": np.tile(np.arange(j), i)})
    table = anova_lm(ols("y ~ C(a) + C(b)", df).fit())
    assert c.ms_init == pytest.approx(table.loc["C(a)", "mean_sq"])
    assert c.ms_data == pytest.approx(table.loc["C(b)", "mean_sq"])
    assert c.ms_residual == pytest.approx(table.loc["Residual", "mean_sq"])
    assert c.init == pytest.approx(max(0.0, (c.ms_init - c.ms_residual) / j))
    assert c.data == pytest.approx(max(0.0, (c.ms_data - c.ms_residual) / i))


def test_crossed_intervals_cover_the_true_components():
    """95% MLS intervals of σ²_init and σ²_data and the χ² interval of σ²_residual cover at ≥ 93% (6 × 6 runs)."""
    rng = np.random.default_rng(7)
    reps, i, j = 600, 6, 6
    s_a, s_b, s_e = 1.0, 0.6, 0.5
    cover = np.zeros(3)
    for _ in range(reps):
        y = rng.normal(0, s_a, (i, 1)) + rng.normal(0, s_b, (1, j)) + rng.normal(0, s_e, (i, j))
        c = crossed_components(y)
        cover += [c.init_ci[0] <= s_a**2 <= c.init_ci[1], c.data_ci[0] <= s_b**2 <= c.data_ci[1],
                  c.residual_ci[0] <= s_e**2 <= c.residual_ci[1]]
    assert np.all(cover / reps >= 0.93), cover / reps


def test_crossed_design_refuses_bad_shapes():
    with pytest.raises(ValueError, match="2 × 2"):
        crossed_components(np.ones((1, 5)))
    with pytest.raises(ValueError, match="NaN"):
        crossed_components(np.array([[1.0, np.nan], [2.0, 3.0]]))


def test_ulp_divergence_by_hand():
    steps = [0, 10, 20, 30]
    twin = np.zeros(4)
    perturbed = np.array([[0.0, 0.1, 1.2, 2.0], [0.0, -0.1, -1.2, -2.0]])
    all_sources = np.array([[0.0, 1.0, 1.0, 1.0], [0.0, -1.0, -1.0, -1.0]])  # SD √2 → band √2·√2 = 2
    d = ulp_divergence(perturbed, twin, all_sources, steps)
    assert d.ratio[1] == pytest.approx(0.1 / 2) and d.ratio[2] == pytest.approx(0.6)
    assert d.first_half == 20 and d.first_full == 30 and d.final == pytest.approx(1.0)
    assert d.ratio[0] == 0.0  # no spread and no difference yet
    assert (d.n_perturbed, d.absorbed) == (2, 0)


def test_a_one_ulp_run_that_never_leaves_its_twin_is_counted_absorbed():
    """A run equal to the twin at every step (NaN where the twin is NaN) is absorbed; one that differs at one step,
    however little, is not."""
    steps = [0, 10, 20]
    twin = np.array([2.0, np.nan, 1.0])
    perturbed = np.array([[2.0, np.nan, 1.0], [2.0, np.nan, 1.0], [2.0, np.nan, np.nextafter(1.0, 2.0)],
                          [2.0, 0.5, 1.0]])
    all_sources = np.array([[2.0, 1.0, 1.0], [2.0, 2.0, 3.0]])
    d = ulp_divergence(perturbed, twin, all_sources, steps)
    assert (d.n_perturbed, d.absorbed) == (4, 2)
