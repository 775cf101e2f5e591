"""The alert evaluators' statistics on runs: finals and whole curves against a baseline, and the
per-study history the suite-shift rule judges. Small hand-checked arrays, no database."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from steady.server.stats.alert_rules import curve_outliers, final_outliers, study_means
from steady.server.stats.report import RunData


def run(run_id: int, steps, values, *, metric: str = "loss") -> RunData:
    return RunData(run_id=run_id, seed=run_id, repeat=0, determinism="seeded", stack="s",
                   series={metric: (np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64))})


BASE_FINALS = [1.00, 1.02, 0.98, 1.01, 0.99]


def test_final_outliers_use_the_prediction_interval_of_the_baseline():
    base = [run(i, [0, 1, 2], [2.0, 1.5, v]) for i, v in enumerate(BASE_FINALS)]
    cand = [run(10, [0, 1, 2], [2.0, 1.5, 1.005]), run(11, [0, 1, 2], [2.0, 1.5, 1.5])]
    fin = final_outliers(base, cand, "loss", alpha=0.05)
    assert fin.step == 2
    assert fin.baseline.tolist() == BASE_FINALS and fin.candidates.tolist() == [1.005, 1.5]
    # x̄ ± t_{1-α/(2m), n-1} · s · sqrt(1 + 1/n), m = 2 candidates (Bonferroni)
    x = np.array(BASE_FINALS)
    half = stats.t.isf(0.05 / 4, 4) * x.std(ddof=1) * math.sqrt(1 + 1 / 5)
    assert fin.check.low == pytest.approx(x.mean() - half) and fin.check.high == pytest.approx(x.mean() + half)
    assert fin.check.outside == (1,)


def test_finals_are_read_at_the_last_step_every_run_logged():
    # the candidate stopped at step 1: every run is read there, not at its own last step
    base = [run(i, [0, 1, 2], [2.0, 1.0 + 0.01 * i, 0.1]) for i in range(4)]
    cand = [run(10, [0, 1], [2.0, 1.015])]
    fin = final_outliers(base, cand, "loss", alpha=0.05)
    assert fin.step == 1
    assert fin.baseline.tolist() == [1.0, 1.01, 1.02, 1.03] and fin.candidates.tolist() == [1.015]
    assert fin.check.outside == ()


def test_a_diverged_candidate_is_outside_and_too_small_a_baseline_cannot_judge():
    base = [run(i, [0, 1], [1.0, v]) for i, v in enumerate(BASE_FINALS)]
    fin = final_outliers(base, [run(10, [0, 1], [1.0, math.nan])], "loss", alpha=0.05)
    assert math.isnan(fin.candidates[0]) and fin.check.outside == (0,)
    one = final_outliers(base[:1], [run(10, [0, 1], [1.0, 1.0])], "loss", alpha=0.05)
    assert one.check is None and one.baseline.size == 1


def test_curve_outliers_align_runs_logged_at_different_steps():
    rng = np.random.default_rng(3)
    steps = np.arange(0, 40, 2)
    curve = np.exp(-steps / 20.0)
    base = [(steps, curve + 0.01 * rng.standard_normal(steps.size)) for _ in range(8)]
    odd = np.arange(1, 41)  # every step: only the even ones are shared with the baseline
    healthy = np.exp(-odd / 20.0) + 0.01 * rng.standard_normal(odd.size)
    check = curve_outliers(base, [(odd, healthy), (odd, healthy + 0.2)], alpha=0.01)
    assert check.n_baseline == 8 and check.n_candidates == 2
    assert check.outside == (1,)


def test_curve_outliers_refuse_runs_without_shared_steps():
    base = [(np.array([0, 1]), np.array([1.0, 0.5 + 0.01 * i])) for i in range(3)]
    with pytest.raises(ValueError):
        curve_outliers(base, [(np.array([5, 6]), np.array([1.0, 0.5]))], alpha=0.01)


def test_study_means_group_by_stack_and_level_and_skip_non_finite_values():
    rows = [(1, "a", "seeded", 1.0), (1, "a", "seeded", 3.0), (1, "a", "seeded", math.nan),
            (2, "a", "seeded", 5.0), (2, "b", "strict", math.inf), (2, "b", "strict", 4.0),
            (3, "a", "seeded", None), (3, "b", "strict", "nan")]
    assert study_means(rows) == {("a", "seeded"): {1: 2.0, 2: 5.0}, ("b", "strict"): {2: 4.0}}
