"""Every interval the report prints holds its own estimate: lower ≤ estimate ≤ upper, and a variance
component's interval stays in [0, ∞). A property over random designs, drawn where intervals break:
zero and near-zero components, quantized (printed) values, ties, a constant arm, 2 to 7 levels a side.
Seeded, so a failure names the design that broke it."""

from __future__ import annotations

import numpy as np
import pytest

from steady.server.stats.bands import compute_band
from steady.server.stats.cost import cost_ratio
from steady.server.stats.intervals import bonett_std_bounds, mean_ci, normal_tolerance_interval, prediction_interval, \
    std_confidence_bounds
from steady.server.stats.portability import compare_stacks
from steady.server.stats.sources import crossed_components, sd_ratio_tost

SCALES = (0.0, 1e-12, 1e-7, 1e-4, 1e-2, 1.0)  # a component's SD: exactly zero, near zero, comparable


def _quantize(rng: np.random.Generator, y: np.ndarray) -> np.ndarray:
    """Sometimes the values as a script prints them: 2 to 4 decimals (ties, exact zeros)."""
    return np.round(y, int(rng.integers(2, 5))) if rng.random() < 0.3 else y


def _sample(rng: np.random.Generator, n: int) -> np.ndarray:
    shape = rng.integers(4)
    scale = float(rng.choice(SCALES))
    if shape == 0:
        x = rng.normal(0.0, scale, n)
    elif shape == 1:  # two-point: the least kurtosis a sample can have
        x = scale * rng.integers(0, 2, n)
    elif shape == 2:  # skewed
        x = scale * rng.lognormal(0.0, 1.0, n)
    else:  # one outlier in otherwise tied values
        x = np.zeros(n)
        x[rng.integers(n)] = scale
    return _quantize(rng, 0.5 + x)


def _holds(lo: float, est: float, hi: float, what: str) -> None:
    assert np.isfinite(lo) and np.isfinite(hi), f"{what}: interval [{lo}, {hi}] of {est}"
    assert lo <= est <= hi, f"{what}: {est} outside its interval [{lo}, {hi}]"


def test_crossed_variance_components_lie_in_their_intervals_and_never_below_zero():
    """The defect: σ²_init 0 printed with the interval [0, −0.00023] (an MLS upper end below zero)."""
    rng = np.random.default_rng(48)
    for k in range(400):
        i, j = (int(v) for v in rng.integers(2, 8, 2))
        s_a, s_b, s_e = (float(v) for v in rng.choice(SCALES, 3))
        y = _quantize(rng, 0.5 + rng.normal(0, s_a, (i, 1)) + rng.normal(0, s_b, (1, j)) + rng.normal(0, s_e, (i, j)))
        c = crossed_components(y)
        for name, est, (lo, hi) in (("init", c.init, c.init_ci), ("data", c.data, c.data_ci),
                                    ("residual", c.residual, c.residual_ci)):
            _holds(lo, est, hi, f"design {k} ({i} × {j}, SDs {s_a:g}/{s_b:g}/{s_e:g}): σ²_{name}")
            assert lo >= 0.0, f"design {k}: σ²_{name} interval [{lo}, {hi}] below zero"


def test_sds_sd_ratios_means_and_bands_lie_in_their_intervals():
    rng = np.random.default_rng(4848)
    for k in range(300):
        n, m = (int(v) for v in rng.integers(5, 30, 2))
        x, y = _sample(rng, n), _sample(rng, m)
        what = f"design {k} (n {n}, {m})"
        b = bonett_std_bounds(x)
        _holds(b.lower, b.std, b.upper, f"{what}: robust SD")
        s = std_confidence_bounds(x)
        _holds(s.lower, s.std, s.upper, f"{what}: SD")
        r = sd_ratio_tost(x, y)
        if np.isfinite(r.ratio):  # a zero SD on one side is exact and printed without an interval
            _holds(r.lower, r.ratio, r.upper, f"{what}: SD ratio")
        for iv in (mean_ci(x), normal_tolerance_interval(x), prediction_interval(x)):
            _holds(iv.low, iv.mean, iv.high, f"{what}: {type(iv).__name__}")
        p = compare_stacks(x, y, margin=0.1, rng=rng, n_resamples=200)
        _holds(p.diff_ci_low, p.diff, p.diff_ci_high, f"{what}: difference of means")
        band = compute_band(np.column_stack([x[:5], y[:5]]))
        for lo, est, hi in zip(np.r_[band.ci_low, band.ti_low], np.r_[band.mean, band.mean],
                               np.r_[band.ci_high, band.ti_high], strict=True):
            _holds(lo, est, hi, f"{what}: band")


@pytest.mark.parametrize("paired", [False, True])
def test_cost_ratios_lie_in_their_intervals(paired):
    rng = np.random.default_rng(480 + paired)
    for k in range(100):
        n = int(rng.integers(2, 8))
        base = float(rng.choice([1e-3, 0.05, 1.0]))
        times = [[base * (1.0 + _sample(rng, 40)) for _ in range(n)] for _ in range(2)]
        c = cost_ratio(times[0], times[1], paired=paired)
        _holds(c.ci_low, c.ratio, c.ci_high, f"design {k} ({n} runs a level)")
