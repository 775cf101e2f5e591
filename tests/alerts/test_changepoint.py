"""The pure shift detector: level under no shift, power and location with a planted shift."""

from __future__ import annotations

import numpy as np
import pytest

from steady.server.stats.changepoint import detect_shift


def _rate(histories, **kw):
    rng = np.random.default_rng(12345)
    results = [detect_shift(h, rng=rng, **kw) for h in histories]
    return results, sum(r.detected for r in results) / len(results)


@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_false_alarm_rate_near_alpha_over_500_histories(alpha):
    gen = np.random.default_rng(2024)
    n_hist = 500
    # histories of different lengths and distributions (normal and skewed): exchangeable, no shift
    histories = [gen.normal(0.3, 0.02, size=gen.integers(6, 25)) for _ in range(n_hist // 2)]
    histories += [gen.lognormal(0.0, 0.5, size=gen.integers(6, 25)) for _ in range(n_hist // 2)]
    _, rate = _rate(histories, alpha=alpha)
    sd = np.sqrt(alpha * (1 - alpha) / n_hist)
    assert abs(rate - alpha) < 3.5 * sd + 1e-9, (rate, alpha)


def test_planted_shift_detected_at_the_right_index():
    gen = np.random.default_rng(7)
    histories, where = [], []
    for _ in range(500):
        n = int(gen.integers(10, 20))
        k = int(gen.integers(4, n - 2))
        h = gen.normal(1.0, 0.1, size=n)
        h[k:] += 0.4  # 4 sigma; at least 2 studies after the change
        histories.append(h)
        where.append(k)
    results, rate = _rate(histories, alpha=0.01)
    assert rate > 0.8  # measured 0.89 (300 histories); the misses are changes 2 studies from the end
    located = [abs(r.index - k) <= 1 for r, k in zip(results, where) if r.detected]
    assert np.mean(located) > 0.95
    exact = [r.index == k for r, k in zip(results, where) if r.detected]
    assert np.mean(exact) > 0.85


def test_direction_and_edge_cases():
    rng = np.random.default_rng(0)
    up = np.r_[np.zeros(8), np.ones(4)] + np.random.default_rng(1).normal(0, 0.05, 12)
    assert detect_shift(up, rng=rng, direction="increase").detected
    assert not detect_shift(up, rng=rng, direction="decrease").detected
    r = detect_shift(up, rng=rng)
    assert r.detected and r.index == 8 and r.mean_after > r.mean_before and r.p_value <= 0.01
    short = detect_shift([1.0, 2.0, 3.0], rng=rng, min_history=5)
    assert not short.detected and "need at least 5" in short.reason
    flat = detect_shift([2.0] * 10, rng=rng)
    assert not flat.detected and flat.p_value == 1.0
    for bad in ([1.0, float("nan"), 2.0, 3.0, 4.0], [[1.0, 2.0]]):
        with pytest.raises(ValueError):
            detect_shift(bad, rng=rng)
    with pytest.raises(ValueError):
        detect_shift(up, rng=rng, alpha=1.5)
    with pytest.raises(ValueError):
        detect_shift(up, rng=None)  # type: ignore[arg-type]


def test_seed_controls_the_p_value():
    x = np.random.default_rng(3).normal(size=15)
    a = detect_shift(x, rng=np.random.default_rng(11), alpha=0.5)
    b = detect_shift(x, rng=np.random.default_rng(11), alpha=0.5)
    c = detect_shift(x, rng=np.random.default_rng(12), alpha=0.5)
    assert a.p_value == b.p_value and a.p_value != c.p_value
