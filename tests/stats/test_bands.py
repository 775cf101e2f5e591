import numpy as np
import pytest
from scipy import stats

from steady.server.stats.align import align_series, first_nonfinite_step
from steady.server.stats.bands import BandBlocks, block_width, compute_band, out_of_band_runs, tolerance_factors
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


def _reference_block_stats(xb, qs, n_out, mean_out, std_out, min_out, max_out, q_out) -> None:
    """The per-block statistics as computed before all-finite blocks took a path of their own
    (every block sorted with NaN last, then gathered column by column)."""
    xs = np.array(xb, dtype=np.float64, copy=True)
    xs[~np.isfinite(xs)] = np.nan
    xs.sort(axis=0)
    finite = ~np.isnan(xs)
    n = finite.sum(axis=0)
    n_out[:] = n
    has = n > 0
    if not has.any():
        return
    cols = np.arange(xs.shape[1])
    last = np.maximum(n - 1, 0)
    min_out[:] = np.where(has, xs[0], np.nan)
    max_out[:] = np.where(has, xs[last, cols], np.nan)
    for j, q in enumerate(qs):
        pos = q * last
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, last)
        a, b = xs[lo, cols], xs[hi, cols]
        q_out[j] = np.where(has, a + (b - a) * (pos - lo), np.nan)
    xs[~finite] = 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = xs.sum(axis=0) / n
        xs -= mu
        xs[~finite] = 0.0
        var = np.einsum("ij,ij->j", xs, xs) / (n - 1)
    mean_out[:] = np.where(has, mu, np.nan)
    std_out[:] = np.where(n > 1, np.sqrt(np.maximum(var, 0.0)), np.nan)


def _reference_stats(x, qs, diverged):
    rows = np.flatnonzero(~diverged)
    runs, m = x.shape
    n = np.zeros(m, dtype=np.int64)
    mean, std, vmin, vmax = (np.full(m, np.nan) for _ in range(4))
    qarr = np.full((len(qs), m), np.nan)
    block = max(256, (1 << 19) // max(rows.size, 1))
    for c0 in range(0, m, block):
        c1 = min(m, c0 + block)
        _reference_block_stats(x[rows, c0:c1] if diverged.any() else x[:, c0:c1], qs, n[c0:c1], mean[c0:c1],
                               std[c0:c1], vmin[c0:c1], vmax[c0:c1], qarr[:, c0:c1])
    return {"n": n, "mean": mean, "std": std, "min": vmin, "max": vmax, "quantiles": qarr}


def _bits(a):
    a = np.asarray(a, dtype=np.float64)
    return np.where(np.isnan(a), np.nan, a).view(np.int64)  # every NaN as the one canonical NaN


def test_band_statistics_equal_the_sorted_gather_reference_bit_for_bit():
    """Blocks whose cells are all finite take their own path; on random shapes with NaN, ±Inf,
    signed zeros and ties (and blocks of both kinds in one matrix) every statistic keeps the bits
    of the sort-and-gather computation, and the quantiles agree with numpy's linear quantile of
    each step's finite values."""
    rng = np.random.default_rng(20261205)
    qs = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0, 1 / 3)
    shapes = [(int(rng.integers(0, 40)), int(rng.integers(1, 400))) for _ in range(40)]
    shapes += [(2100, 700)]  # column blocks of 256 steps: finite blocks beside blocks with missing points
    for i, (runs, m) in enumerate(shapes):
        x = rng.normal(0.0, 1.0, (runs, m)) * 10.0 ** rng.integers(-3, 4, (runs, 1))
        x[rng.random((runs, m)) < 0.1] = np.round(x[rng.random((runs, m)) < 0.1].mean() if runs else 0.0)
        x[rng.random((runs, m)) < 0.02] = rng.choice([0.0, -0.0])
        kind = i % 4  # 0: all finite, 1: NaN (missing points), 2: NaN and ±Inf in rows, 3: NaN in one block only
        if kind in (1, 2):
            x[rng.random((runs, m)) < 0.15] = np.nan
        if kind == 2 and runs:
            x[rng.integers(0, runs, 2), rng.integers(0, m, 2)] = [np.inf, -np.inf]
        if kind == 3 and runs and m > 300:
            x[rng.integers(0, runs, 50), rng.integers(300, m, 50)] = np.nan
        for diverged in (None, rng.random(runs) < 0.2):
            band = compute_band(x, quantiles=qs, diverged=diverged)
            div = np.isinf(x).any(axis=1) if diverged is None else diverged
            ref = _reference_stats(x, qs, div)
            assert np.array_equal(band.n, ref["n"]), (runs, m, kind)
            for name in ("mean", "std", "min", "max", "quantiles"):
                got = band.quantiles if name == "quantiles" else getattr(band, name)
                assert np.array_equal(_bits(got), _bits(ref[name])), (name, runs, m, kind)
            kept = x[~div]
            for col in rng.integers(0, m, 5):
                values = kept[:, col][np.isfinite(kept[:, col])]
                if values.size:
                    np.testing.assert_allclose(band.quantiles[:, col], np.quantile(values, qs), rtol=1e-13,
                                               atol=1e-300)
                else:
                    assert np.isnan(band.quantiles[:, col]).all()


def test_tolerance_factors_per_step_are_the_factor_of_each_steps_n():
    for n in (np.full(1000, 12), np.array([12, 3, 1, 0, 12, 40, 3]), np.full(5, 1), np.zeros(0, np.int64)):
        want = [normal_tolerance_factor(int(v), coverage=0.9, confidence=0.95) if v >= 2 else np.nan for v in n]
        np.testing.assert_array_equal(tolerance_factors(n, coverage=0.9, confidence=0.95), np.array(want, dtype=float))


def _same_band(a, b) -> None:
    for field in ("steps", "n", "mean", "std", "min", "max", "quantiles", "ci_low", "ci_high", "ti_low", "ti_high"):
        assert getattr(a, field).tobytes() == getattr(b, field).tobytes(), field
    assert (a.n_runs, a.excluded_runs, a.quantile_levels) == (b.n_runs, b.excluded_runs, b.quantile_levels)


@pytest.mark.parametrize("owned", [False, True])
def test_band_of_blocks_is_compute_band_bit_for_bit(owned):
    """The band of a matrix given in its ``block_width`` column blocks, in any order (as streamed reads
    hand them over to several threads; each block an array of its own when ``owned``), is
    ``compute_band``'s, bit for bit; blocks given as views are left as they were."""
    rng = np.random.default_rng(3)
    rows = 7
    width = block_width(rows)
    x = rng.lognormal(size=(rows, 2 * width + 5))
    x[2, 10] = np.nan  # a missing point: n = rows - 1 at that step
    x[:, width + 1] = -0.0
    steps = np.arange(x.shape[1]) * 10
    want = compute_band(x, steps=steps, coverage=0.8, confidence=0.9, diverged=np.zeros(rows, bool))
    before = x.copy()
    band = BandBlocks(steps, n_runs=rows, coverage=0.8, confidence=0.9)
    for c0 in reversed(range(0, x.shape[1], width)):
        band.add(c0, np.array(x[:, c0:c0 + width]) if owned else x[:, c0:c0 + width], owned=owned)
    got = band.band()
    _same_band(got, want)
    assert got.n[10] == rows - 1
    if not owned:
        assert x.tobytes() == before.tobytes()


def test_band_blocks_refuse_blocks_that_do_not_cover_the_steps():
    x = np.ones((3, 10))
    band = BandBlocks(np.arange(10), n_runs=3)
    band.add(0, x[:, :5])
    with pytest.raises(ValueError, match="hold 5 of the 10"):
        band.band()
    with pytest.raises(ValueError, match="outside the 10 steps"):
        band.add(7, x[:, :5])
    band.add(5, x[:, 5:])
    assert band.band().n.tolist() == [3] * 10
