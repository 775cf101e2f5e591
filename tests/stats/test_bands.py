import numpy as np
import pytest
from scipy import stats

from steady.server.stats.align import align_series, first_nonfinite_step
from steady.server.stats.bands import compute_band, out_of_band_runs
from steady.server.stats.downsample import extreme_indices
from steady.server.stats.intervals import normal_tolerance_factor
from tests.stats.rate_checks import design


def test_align_union_of_steps_and_divergence():
    a = align_series({
        "a": (np.array([0, 10, 20]), np.array([1.0, 2.0, 3.0])),
        "b": (np.array([10, 30]), np.array([np.nan, 4.0])),
    })
    assert a.steps.tolist() == [0, 10, 20, 30]
    assert a.present.tolist() == [[True, True, True, False], [False, True, False, True]]
    assert np.isnan(a.values[1, 0]) and a.values[1, 3] == 4.0
    assert a.diverged_at == (None, 10)
    assert a.diverged.tolist() == [False, True]
    assert first_nonfinite_step(np.array([1, 2, 3]), np.array([0.0, np.inf, 1.0])) == 2


def test_align_validation():
    with pytest.raises(ValueError, match="strictly increasing"):
        align_series({"a": (np.array([1, 1]), np.array([0.0, 1.0]))})
    with pytest.raises(ValueError, match="equal length"):
        align_series({"a": (np.array([1, 2]), np.array([0.0]))})


def test_band_matches_numpy_references_with_missing_points():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 40))
    x[3, 20:] = np.nan  # shorter run
    x[:10, 5] = np.nan  # step with n = 2
    x[:, 6] = np.nan  # step with n = 0
    b = compute_band(x, quantiles=(0.1, 0.5, 0.9))
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        np.testing.assert_allclose(b.mean, np.nanmean(x, axis=0), equal_nan=True)
        np.testing.assert_allclose(b.std, np.nanstd(x, axis=0, ddof=1), equal_nan=True)
        np.testing.assert_allclose(b.quantiles, np.nanquantile(x, [0.1, 0.5, 0.9], axis=0), equal_nan=True)
        np.testing.assert_allclose(b.min, np.nanmin(x, axis=0), equal_nan=True)
        np.testing.assert_allclose(b.max, np.nanmax(x, axis=0), equal_nan=True)
    assert b.n[5] == 2 and b.n[6] == 0 and b.n[25] == 11 and b.n[0] == 12
    col = x[:, 25][np.isfinite(x[:, 25])]
    k = normal_tolerance_factor(11, coverage=0.9, confidence=0.95)
    assert b.ti_high[25] == pytest.approx(col.mean() + k * col.std(ddof=1))
    from scipy import stats
    lo, hi = stats.t.interval(0.95, 10, loc=col.mean(), scale=stats.sem(col))
    assert (b.ci_low[25], b.ci_high[25]) == pytest.approx((lo, hi))


def test_diverged_runs_are_excluded_and_counted():
    x = np.ones((4, 5))
    x[2, 3] = np.inf
    b = compute_band(x)
    assert b.excluded_runs == (2,) and b.n.tolist() == [3] * 5
    b2 = compute_band(x, diverged=[False, True, True, False])
    assert b2.excluded_runs == (1, 2) and b2.n.tolist() == [2] * 5
    with pytest.raises(ValueError, match="one flag per run"):
        compute_band(x, diverged=[True])


def test_out_of_band_false_flag_rate_is_exact_and_a_planted_shift_is_flagged():
    """Steps independent and normal, the model of the per-step rule: a run's exceedance count is exactly
    Binomial(K, q), q the in-sample probability of leaving mean ± k·s (Pope 1976: n(x − x̄)²/((n − 1)²s²) ~
    Beta(1/2, (n − 2)/2)), so the chance a healthy run is flagged is exactly P(Binomial(K, q) > the threshold)
    (4.5% at a 5% level: discreteness). Run 0 of 400 studies: its count rules out twice that (a doubled
    rate fails with probability ≥ 0.95, exact) and is not below it beyond simulation error."""
    n, steps, level = 20, 200, 0.05
    k = normal_tolerance_factor(n, coverage=0.9, confidence=0.95)
    q = float(stats.beta.sf(n * k * k / (n - 1) ** 2, 0.5, (n - 2) / 2.0))
    threshold = int(stats.binom.isf(level, steps, q))
    exact = float(stats.binom.sf(threshold, steps, q))
    assert 0.03 < exact <= level
    check = design(2 * exact, (400,))
    assert check.pass_probability(2 * exact) <= 0.05 and check.pass_probability(exact) >= 0.95
    rng = np.random.default_rng(2024)
    flagged = 0
    for _ in range(400):
        x = rng.normal(size=(n, steps))
        r = out_of_band_runs(x, compute_band(x, coverage=0.9, confidence=0.95), false_alarm=level)
        assert r.q == pytest.approx(q, rel=1e-9) and r.threshold.tolist() == [threshold] * n
        flagged += bool(r.flagged[0])
    ok, _, _ = check.run(lambda _: flagged)
    assert ok and stats.binom.cdf(flagged, 400, exact) > 0.01, f"{flagged}/400 flagged, exactly {exact:.4f} expected"
    x = rng.normal(size=(20, 200))
    x[7] += 1.5
    b = compute_band(x)
    r = out_of_band_runs(x, b, false_alarm=0.01, bonferroni=True)
    assert r.flagged[7] and r.flagged.sum() == 1
    assert r.level == pytest.approx(0.01 / 20)


def test_downsample_keeps_extremes_in_order():
    rng = np.random.default_rng(1)
    y = rng.normal(size=10_001)
    y[1234], y[8765] = 50.0, -50.0
    idx = extreme_indices(y, max_points=100)
    assert idx.size <= 100 and np.all(np.diff(idx) > 0)
    assert 1234 in idx and 8765 in idx
    # every bucket's min and max survive
    edges = np.linspace(0, y.size, 51).astype(int)
    for a, b in zip(edges[:-1], edges[1:]):
        assert a + np.argmin(y[a:b]) in idx and a + np.argmax(y[a:b]) in idx
    assert extreme_indices(y[:10], max_points=100).tolist() == list(range(10))


def test_default_exceedance_probability_matches_simulation():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(15, 20_000))
    b = compute_band(x)
    r = out_of_band_runs(x, b)
    assert r.exceedances.sum() / x.size == pytest.approx(r.q, rel=0.05)
    new = rng.normal(size=(1, 20_000))
    r2 = out_of_band_runs(new, b, in_sample=False)
    assert r2.exceedances[0] / 20_000 == pytest.approx(r2.q, rel=0.1)
