"""Where the cost of determinism takes its step times from, and why it is missing when it is: a run's own
``step_time`` first, then TensorBoard wall times, then step-line arrival times; one source for both levels."""

from __future__ import annotations

import numpy as np
import pytest

from steady.server.stats.report import build_report
from steady.server.stats.report_data import MetricSpec, RunData


def _run(i: int, level: str, times: dict[str, float], *, stack: str = "default") -> RunData:
    steps = np.arange(20, dtype=np.int64)
    rng = np.random.default_rng(i)
    series = {"loss": (steps, np.linspace(1.0, 0.1, 20))}
    for key, mean in times.items():
        series[key] = (steps, mean * (1 + 0.01 * rng.standard_normal(20)))
    return RunData(run_id=i, seed=i, repeat=0, determinism=level, stack=stack, series=series)


def _cost(runs: list[RunData]):
    report = build_report(runs, [MetricSpec("loss")], rng=np.random.default_rng(0)).to_data()
    return report["determinism_cost"], report["cost_note"]


def test_step_line_arrival_times_give_a_cost_and_say_so():
    runs = [_run(i, "seeded", {"step_time:stdout": 0.1}) for i in range(3)]
    runs += [_run(10 + i, "strict", {"step_time:stdout": 0.3}) for i in range(3)]
    (cost,), note = _cost(runs)
    assert note is None
    assert cost["source"] == "step_time:stdout" and "step lines on stdout" in cost["source_text"]
    assert cost["ratio"] == pytest.approx(3.0, rel=0.02) and cost["ci_low"] < 3.0 < cost["ci_high"]


def test_the_runs_own_step_times_win_and_both_levels_share_one_source():
    # every run logs step_time (ratio 2) and prints step lines (ratio 5): the logged times are compared
    runs = [_run(i, "seeded", {"step_time": 0.1, "step_time:stdout": 0.1}) for i in range(2)]
    runs += [_run(10 + i, "strict", {"step_time": 0.2, "step_time:stdout": 0.5}) for i in range(2)]
    (cost,), _ = _cost(runs)
    assert cost["source"] == "step_time" and cost["ratio"] == pytest.approx(2.0, rel=0.02)
    # strict runs only have TensorBoard times, seeded runs have both: TensorBoard for both levels
    runs = [_run(i, "seeded", {"step_time:tensorboard": 0.1, "step_time:stdout": 0.1}) for i in range(2)]
    runs += [_run(10 + i, "strict", {"step_time:tensorboard": 0.4}) for i in range(2)]
    (cost,), _ = _cost(runs)
    assert cost["source"] == "step_time:tensorboard" and cost["ratio"] == pytest.approx(4.0, rel=0.02)


def test_a_missing_cost_says_why():
    one_level = [_run(i, "seeded", {"step_time:stdout": 0.1}) for i in range(3)]
    assert _cost(one_level) == ([], "only one determinism level (seeded) per stack: the cost compares step "
                                     "times between two levels of one stack")
    untimed = [_run(i, level, {}) for i, level in enumerate(["seeded", "strict"] * 2)]
    costs, note = _cost(untimed)
    assert costs == [] and note.startswith("no step times captured")
    half = [_run(0, "seeded", {"step_time:stdout": 0.1}), _run(1, "strict", {})]
    costs, note = _cost(half)
    assert costs == [] and note == ("step times at only one determinism level per stack: "
                                    "default: seeded of seeded, strict")
    assert _cost([]) == ([], None)
