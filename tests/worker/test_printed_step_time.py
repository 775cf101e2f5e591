"""A step time the script prints itself (``ms/batch``) is captured as the run's own ``step_time`` through a
pattern's ``step_time`` group, and the cost of determinism is computed from it and says so."""

from __future__ import annotations

import numpy as np
import pytest

from steady.server.stats.report import MetricSpec, RunData, build_report
from steady.worker.agent.local import run_local

SCRIPT = """
import sys
slow = float(sys.argv[1])
for step in range(8):
    print(f"| epoch   1 | {step:5d}/    8 batches | lr 20.00 | ms/batch {slow * (40 + step % 3):5.2f} | loss  {7 - 0.1 * step:5.2f}",
          flush=True)
"""
PATTERN = r"(?P<step>\d+)/ *\d+ batches .*ms/batch +(?P<step_time>[0-9.]+) .*loss +(?P<loss>[0-9.]+)"


@pytest.mark.slow
def test_a_printed_ms_per_batch_is_the_runs_own_step_time(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    runs = []
    for i, (level, slow) in enumerate((("strict", 2.0), ("strict", 2.0), ("none", 1.0), ("none", 1.0))):
        r = run_local({"framework": "python", "seed": i, "determinism": level, "threads": 1, "time_limit_s": 120,
                       "command": ["python", str(script), str(slow)], "capture": {"patterns": [PATTERN]}},
                      work_dir=str(tmp_path / f"run{i}"))
        assert r.ok, r.stderr_tail
        steps, values = r.series["step_time"]
        assert steps == list(range(8)) and values == [round(slow * (40 + s % 3), 2) for s in steps]
        runs.append(RunData(run_id=i + 1, seed=i, repeat=0, determinism=level, stack="cpu",
                            series={k: (np.asarray(st), np.asarray(v, float)) for k, (st, v) in r.series.items()}))
    report = build_report(runs, [MetricSpec("loss")], rng=np.random.default_rng(0))
    (cost,) = [c for c in report.determinism_cost if (c["numerator"], c["denominator"]) == ("strict", "none")]
    assert cost["source"] == "step_time" and "printed and captured as step_time" in cost["source_text"]
    assert cost["ratio"] == pytest.approx(2.0) and cost["summary"].startswith("strict costs ×2 the step time of none")
