"""The terminal report reads the stats core's real output shape."""

from __future__ import annotations

import numpy as np

from steady.server.reports.models import Report
from steady.server.reports.parts import DeterminismCost
from steady.server.cli.render import render_report
from steady.server.stats.report import MetricSpec, RunData, build_report

STUDY = {"id": 1, "name": "s", "status": "completed"}


def test_render_variance_and_cost_from_a_real_report():
    rng = np.random.default_rng(0)
    steps = np.arange(20)
    runs = []
    for level, slow in (("seeded", 1.0), ("strict", 1.5)):
        for seed in range(3):
            for repeat in range(2):
                loss = np.linspace(1, 0.1, 20) + 0.01 * seed + rng.normal(0, 1e-3, 20)
                runs.append(RunData(run_id=len(runs) + 1, seed=seed, repeat=repeat, determinism=level, stack="cpu",
                                    series={"loss": (steps, loss), "step_time": (steps, slow * (0.01 + rng.normal(0, 1e-4, 20)))}))
    report = build_report(runs, [MetricSpec(name="loss")], rng=np.random.default_rng(1))
    text = render_report(Report.assemble(report, study=STUDY))
    assert "loss  seeded / cpu: nondeterminism share" in text and "within-seed var" in text
    (line,) = [x for x in text.splitlines() if "strict / seeded (cpu): strict costs ×" in x]
    assert abs(float(line.split("×")[1].split()[0]) - 1.5) < 0.02 and "(95% CI " in line


def test_render_cost_verdict_against_budget():
    from steady.server.cli.render import _cost_line
    from steady.server.stats.cost import cost_ratio

    slow = [np.full(20, 0.03) * f for f in (1.0, 1.02, 0.98)]
    fast = [np.full(20, 0.01) * f for f in (1.0, 1.01, 0.99)]
    entry = DeterminismCost(stack="cpu", **cost_ratio(slow, fast, numerator="strict", denominator="seeded",
                                                      budget=1.5).__dict__)
    line = _cost_line(entry)
    assert line.startswith("strict / seeded (cpu): strict costs ×3 the step time of seeded (95% CI 2.88–3.13)"), line
    assert "fail against budget ×1.5" in line and "false 'fail' ≤ 2.5%" in line
    assert "against budget" not in _cost_line(entry.model_copy(update={"verdict": None, "budget": None}))
    assert _cost_line(entry.model_copy(update={"ratio": float("nan")})).endswith(
        "not available")


def test_a_cost_whose_interval_covers_1_is_no_evidence_of_a_cost():
    """A bare ratio carries no evidence when its interval covers 1: the line says so, with the interval."""
    from steady.server.cli.render import _cost_line
    from steady.server.stats.cost import cost_ratio

    noisy = [np.full(20, 0.01) * f for f in (1.0, 0.45, 0.8)]
    other = [np.full(20, 0.01) * f for f in (1.2, 1.6, 1.1)]
    c = cost_ratio(noisy, other, numerator="strict", denominator="none")
    assert c.ci_low < 1 < c.ci_high
    line = _cost_line(DeterminismCost(stack="cpu", **c.__dict__))
    assert line.startswith(f"strict / none (cpu): no evidence of a cost (ratio ×{c.ratio:.3g}, 95% CI "), line
    assert line.endswith("covers 1)") and c.summary in c.reason
    one = cost_ratio(noisy[:1], other[:1], numerator="strict", denominator="none")
    assert "no interval, so no evidence of a cost either way" in one.summary


def test_render_shows_each_verdicts_guarantee():
    rng = np.random.default_rng(3)
    steps = np.arange(30)
    runs = [RunData(run_id=i + 1, seed=i, repeat=0, determinism="seeded", stack="cpu",
                    series={"loss": (steps, np.linspace(1, 0.1, 30) + rng.normal(0, 0.01) + rng.normal(0, 1e-3, 30))})
            for i in range(6)]
    report = build_report(runs, [MetricSpec(name="loss", max_std=0.5)], rng=np.random.default_rng(1))
    text = render_report(Report.assemble(report, study=STUDY))
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if "loss  seeded / cpu" in line and "stable" in line)
    assert lines[i].rstrip().endswith("the limit 0.5, below it with 95% confidence")  # the plain first line
    assert "upper 95% bound" in lines[i + 1]  # then the statistics
    assert "guarantee: each claim wrong ≤ 5%" in lines[i + 2]
    assert "out-of-band runs: false alarm ≤ 1% per study" in lines[i + 2]


def test_render_headline_per_level_and_none_variance_note():
    rng = np.random.default_rng(3)
    runs, i = [], 0
    for det in ("none", "seeded"):
        for seed in (1, 2):
            for rep in (0, 1):
                i += 1
                v = np.linspace(2, 1, 10) + 0.1 * seed + (rng.normal(0, 1e-3, 10) if det == "none" else 0)
                runs.append(RunData(run_id=i, seed=seed, repeat=rep, determinism=det, stack="cpu",
                                    series={"loss": (np.arange(10), v)}))
    rep = build_report(runs, [MetricSpec("loss")], rng=np.random.default_rng(0))
    text = render_report(Report.assemble(rep, study=STUDY))
    assert "seeded  expected identical unless kernels are known to vary: met" in text
    assert "none    expected varies: met" in text
    assert "the between-seed split does not apply" in text


def test_render_says_there_is_no_variance_to_split_when_every_run_is_identical():
    """A hard-coded seed: every run of every seed gives the same final value; the share of
    nondeterminism is 0/0, which the report says in words, never as "nan%"."""
    steps = np.arange(20)
    loss = 1.0 / (steps + 2.0)  # the final value 0.0476… in every run
    runs = [RunData(run_id=seed * 2 + repeat + 1, seed=seed, repeat=repeat, determinism="seeded", stack="cpu",
                    series={"loss": (steps, loss.copy())}) for seed in range(3) for repeat in range(2)]
    report = build_report(runs, [MetricSpec(name="loss")], rng=np.random.default_rng(1))
    text = render_report(Report.assemble(report, study=STUDY))
    assert "nan%" not in text
    assert "loss  seeded / cpu: no variance to split: every run's final value is identical" in text
