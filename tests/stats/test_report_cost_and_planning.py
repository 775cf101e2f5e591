"""The report's determinism-cost entries: design (paired on one worker, else Welch), budget verdict."""
from __future__ import annotations

import numpy as np
import pytest

from steady.server.stats.cost import cost_ratio
from steady.server.stats.report import MetricSpec, RunData, build_report


def _runs(workers, slow=1.5, seed=0):
    rng = np.random.default_rng(seed)
    steps = np.arange(40)
    out = []
    for s in range(3):
        machine = float(np.exp(rng.normal(0, 0.2)))
        for level, factor in (("seeded", 1.0), ("strict", slow)):
            t = machine * factor * 0.01 * np.exp(rng.normal(0, 0.02, 40))
            t[:4] *= 10  # warm-up
            out.append(RunData(run_id=len(out) + 1, seed=s, repeat=0, determinism=level, stack="cpu",
                               series={"loss": (steps, np.linspace(1, 0.1, 40)), "step_time": (steps, t)},
                               worker=workers(s, level)))
    return out


def _cost(runs, **kw):
    rep = build_report(runs, [MetricSpec(name="loss")], rng=np.random.default_rng(0), **kw).to_dict()
    (entry,) = rep["determinism_cost"]
    return entry


def test_pairs_on_one_worker_are_compared_paired():
    runs = _runs(lambda s, level: 7)
    c = _cost(runs, cost_budget=2.0)
    assert c["design"] == "paired" and c["numerator"] == "strict" and c["denominator"] == "seeded"
    ref = cost_ratio([r.series["step_time"][1] for r in runs if r.determinism == "strict"],
                     [r.series["step_time"][1] for r in runs if r.determinism == "seeded"], numerator="strict",
                     denominator="seeded", paired=True, budget=2.0)
    assert c["ratio"] == pytest.approx(ref.ratio) and c["ci_low"] == pytest.approx(ref.ci_low)
    assert c["ratio"] == pytest.approx(1.5, rel=0.05)
    assert c["verdict"] == "pass" and c["budget"] == 2.0 and "false 'fail' ≤ 2.5%" in c["guarantee"]


def test_runs_on_different_workers_are_independent_samples():
    c = _cost(_runs(lambda s, level: f"{level}-{s}"), cost_budget=1.2)
    assert c["design"] == "independent" and c["df"] is not None
    # Welch across machines: the CI (1.24–1.82 here) is wide, and still above a ×1.2 budget
    assert c["verdict"] == "fail" and 1.2 < c["ci_low"] < c["ratio"] < c["ci_high"]
    paired = _cost(_runs(lambda s, level: 7), cost_budget=1.2)  # the same draws, every pair on one machine
    assert c["ci_high"] - c["ci_low"] > 2 * (paired["ci_high"] - paired["ci_low"])
    within = _cost(_runs(lambda s, level: f"{level}-{s}"), cost_budget=1.5)  # a budget inside the CI: not decided
    assert within["verdict"] == "inconclusive" and within["ci_low"] < 1.5 < within["ci_high"]
    assert _cost(_runs(lambda s, level: None))["design"] == "independent"


def test_without_budget_ratio_and_ci_only():
    c = _cost(_runs(lambda s, level: 1))
    assert c["verdict"] is None and c["budget"] is None and c["ci_low"] < c["ratio"] < c["ci_high"]


def test_identical_levels_bit_identical_step_times_are_exact():
    steps = np.arange(10)
    runs = [RunData(run_id=i + 1, seed=i // 2, repeat=0, determinism=("seeded", "strict")[i % 2], stack="cpu",
                    series={"loss": (steps, np.ones(10)), "step_time": (steps, np.full(10, 0.02))})
            for i in range(6)]
    c = _cost(runs, cost_budget=1.5)
    assert (c["ratio"], c["ci_low"], c["ci_high"], c["verdict"]) == (1.0, 1.0, 1.0, "pass")


def _finals(values_by_stack):
    steps = np.arange(5)
    out = []
    for stack, values in values_by_stack.items():
        for seed, v in enumerate(values):
            out.append(RunData(run_id=len(out) + 1, seed=seed, repeat=0, determinism="seeded", stack=stack,
                               series={"loss": (steps, np.r_[np.ones(4), v])}))
    return out


def test_inconclusive_verdicts_state_the_alternative_they_plan_for():
    rng = np.random.default_rng(2)
    a, b = rng.normal(0.0, 1.0, 6), rng.normal(0.45, 1.0, 6)
    rep = build_report(_finals({"a": a, "b": b}), [MetricSpec("loss", margin=0.5, max_std=1.0)],
                       reference_stack="a", rng=np.random.default_rng(0)).to_dict()
    (port,) = [v for v in rep["verdicts"] if v["level"] == "stack_portability"]
    assert port["verdict"] == "inconclusive"
    assert "indistinguishable from the margin at this precision" in port["reason"]
    assert "to show |Δ| < 0.5 when the true Δ is 0" in port["reason"] and "seeds per stack" in port["reason"]
    seeds = [v for v in rep["verdicts"] if v["level"] == "seed_stability"]
    assert seeds and all(v["verdict"] == "inconclusive" for v in seeds)
    assert all("indistinguishable from the limit at this precision" in v["reason"] for v in seeds)
    assert all("when the true σ is" in v["reason"] and "power 80%" in v["reason"] for v in seeds)
    assert all(v["n_needed"] < 1000 for v in seeds)


def test_duplicate_seed_repeat_runs_are_all_counted_unpaired():
    runs = _runs(lambda s, level: 7)
    extra = RunData(run_id=99, seed=0, repeat=0, determinism="strict", stack="cpu", series=runs[1].series, worker=7)
    c = _cost([*runs, extra])
    assert c["design"] == "independent" and c["n_numerator"] == 4 and c["n_denominator"] == 3
