"""Alignment over the whole int64 step range."""
from __future__ import annotations

import numpy as np

from steady.server.stats.align import align_series
from steady.server.stats.report import MetricSpec, RunData, build_report

LO, HI = -(2**62) - 5, 2**62 + 5  # 2**63 + 10 apart: np.diff of int64 overflows here


def test_steps_2_63_apart_align_and_judge():
    steps = np.array([LO, HI], dtype=np.int64)
    a = align_series({"a": (steps, [1.0, 3.0]), "b": (np.array([0, HI]), [2.0, 3.0])})
    assert a.steps.tolist() == [LO, 0, HI]
    assert a.present.tolist() == [[True, False, True], [False, True, True]]
    runs = [RunData(run_id=i + 1, seed=i, repeat=0, determinism="seeded", stack="s",
                    series={"loss": (steps, np.array([1.0, 3.0 + i]))}) for i in range(3)]
    report = build_report(runs, [MetricSpec(name="loss")], rng=np.random.default_rng(0))
    assert {v.level for v in report.verdicts} >= {"seed_stability"}


def test_decreasing_steps_still_refused():
    import pytest

    with pytest.raises(ValueError, match="strictly increasing"):
        align_series({"a": (np.array([HI, LO], dtype=np.int64), [1.0, 2.0])})
