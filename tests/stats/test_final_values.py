"""A run's final value is its last logged value, whatever its step; values of repeats are compared only
at the steps they share, and the words say when there are none."""
from __future__ import annotations

import numpy as np
import pytest

from steady.server.stats.report import MetricSpec, RunData, build_report


def _converging(seed: int, *, threshold: float = 1e-3):
    """A loss that decays at a seed-dependent rate until it is below ``threshold`` (like a script that trains
    until it converges): one point every 5 steps, the last one the first below the threshold."""
    rate = 0.01 + 0.004 * seed
    steps = np.arange(0, 5000, 5, dtype=np.int64)
    loss = 2.0 * np.exp(-rate * steps)
    stop = int(np.argmax(loss < threshold))
    return steps[:stop + 1], loss[:stop + 1]


def _verdict(rep, level, det="seeded"):
    (v,) = [v for v in rep["verdicts"] if v["level"] == level and v["group"].get("determinism") == det]
    return v


def test_runs_that_stop_at_seed_dependent_steps_are_judged_on_their_last_value():
    runs = [RunData(run_id=s, seed=s, repeat=0, determinism="seeded", stack="a", series={"loss": _converging(s)})
            for s in range(5)]
    rep = build_report(runs, [MetricSpec("loss", max_std=0.01)], rng=np.random.default_rng(0)).to_dict()
    v = _verdict(rep, "seed_stability")
    last = [_converging(s) for s in range(5)]
    assert v["final_values"] == pytest.approx([float(vals[-1]) for _, vals in last])
    assert v["final_steps"] == [int(steps[-1]) for steps, _ in last]
    lo, hi = min(v["final_steps"]), max(v["final_steps"])
    assert lo < hi and v["final_step"] is None
    assert f"final values at each run's last step, {lo:,}–{hi:,}" in v["reason"]
    q1, med, q3 = np.quantile(v["final_steps"], [0.25, 0.5, 0.75])
    assert v["final_step_spread"] == {"n": 5, "min": lo, "max": hi, "median": med, "q1": q1, "q3": q3}
    assert "the runs stopped at different steps" in v["reason"]
    # the spread of the values the runs ended on (all below 1e-3) is judged, not "too few seeds"
    assert v["spread"]["n"] == 5 and v["verdict"] == "stable"
    assert "too few seeds" not in v["summary"] and "share no logged step" not in v["reason"]
    assert "more" not in v["summary"]


def test_repeats_that_share_no_step_say_no_value_was_compared():
    """At none, two repeats converge at different steps (unseeded): no value was compared at a common
    step, so no sentence may read as if they were equal ("differ: by up to 0 from step 325")."""
    a = (np.array([325], dtype=np.int64), np.array([0.000584]))
    b = (np.array([790], dtype=np.int64), np.array([0.000912]))
    runs = [RunData(run_id=i, seed=0, repeat=i, determinism="none", stack="a", series={"loss": sv})
            for i, sv in enumerate((a, b))]
    rep = build_report(runs, [MetricSpec("loss")], rng=np.random.default_rng(0)).to_dict()
    v = _verdict(rep, "repeatability", "none")
    assert v["verdict"] == "out_of_tolerance"
    assert v["steps_compared"] == 0 and v["last_steps"] == [325, 790]
    assert "share no logged step, so no value was compared; they stopped at steps 325 and 790" in v["summary"]
    assert "by up to" not in v["summary"] and "from step" not in v["summary"]
    assert "their values were not compared" in v["reason"] and "max |Δ|" not in v["reason"]


def test_repeats_equal_where_both_logged_but_stopping_apart_say_so():
    steps = np.arange(0, 100, dtype=np.int64)
    vals = 1.0 / (1.0 + steps)
    runs = [RunData(run_id=0, seed=0, repeat=0, determinism="seeded", stack="a", series={"loss": (steps[:40], vals[:40])}),
            RunData(run_id=1, seed=0, repeat=1, determinism="seeded", stack="a", series={"loss": (steps, vals)})]
    rep = build_report(runs, [MetricSpec("loss")], rng=np.random.default_rng(0)).to_dict()
    v = _verdict(rep, "repeatability")
    assert v["steps_compared"] == 40
    assert v["summary"].startswith("repeats differ: equal at the 40 step(s) all logged, but they stopped at steps 39 "
                                   "and 99")
    assert "40 common step(s) compared" in v["reason"]


def test_portability_judges_last_values_and_says_where():
    rng = np.random.default_rng(3)
    runs = []
    for i, (stack, seed) in enumerate([(s, k) for s in ("a", "b") for k in range(6)]):
        n = 50 + 10 * seed + (5 if stack == "b" else 0)
        steps = np.arange(n, dtype=np.int64)
        vals = 0.5 + 0.01 * rng.standard_normal(n)
        runs.append(RunData(run_id=i, seed=seed, repeat=0, determinism="seeded", stack=stack, series={"loss": (steps, vals)}))
    rep = build_report(runs, [MetricSpec("loss", margin=0.05)], rng=np.random.default_rng(0)).to_dict()
    (v,) = [v for v in rep["verdicts"] if v["level"] == "stack_portability"]
    assert v["final_steps"] == [49 + 10 * k for k in range(6)] + [54 + 10 * k for k in range(6)]
    assert "final values at each run's last step, 49–104" in v["reason"]
    (sv,) = [x for x in rep["variance_by_source"] if x["group"]["stack"] == "a"]
    assert sv["final_step"] is None


def test_a_run_whose_step_counter_restarted_says_which_value_was_judged():
    steps = np.array([10, 20, 29], dtype=np.int64)
    runs = [RunData(run_id=s, seed=s, repeat=0, determinism="seeded", stack="a",
                    series={"loss": (steps, np.array([6.9, 6.8, 6.7]) + 0.01 * s)},
                    restarts={"loss": {"line": 5, "step_before": 29, "step_after": 10}} if s == 1 else {})
            for s in range(3)]
    rep = build_report(runs, [MetricSpec("loss", max_std=1.0)], rng=np.random.default_rng(0)).to_dict()
    v = _verdict(rep, "seed_stability")
    assert "run(s) 1: the final value judged is the first value logged at the run's highest step" in v["reason"]
    assert "went back at output line 5, step 29 then 10" in v["reason"]
    assert v["summary"].endswith("(judged on the first value at each run's highest step, not the last printed one: "
                                 "the step counter restarted in 1 run(s))")


def test_runs_that_share_no_step_say_the_band_compared_none():
    runs = [RunData(run_id=s, seed=s, repeat=0, determinism="seeded", stack="a",
                    series={"loss": (np.array([100 + 5 * s]), np.array([0.0005 + 1e-5 * s]))}) for s in range(5)]
    rep = build_report(runs, [MetricSpec("loss", max_std=1.0)], rng=np.random.default_rng(0)).to_dict()
    v = _verdict(rep, "seed_stability")
    assert v["verdict"] == "stable" and "final values at each run's last step, 100–120" in v["reason"]
    assert "the runs share no logged step, so no step's band holds them all" in v["reason"]
    assert v["out_of_band_test"]["testable"] is False
