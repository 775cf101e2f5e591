"""Digests without user code, and what attribution makes of them at determinism ``none``: a script
that only logs is blamed on seeding (unseeded initialisation), not on kernels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from steady.server.stats.expectations import SEEDS_IDENTICAL, SeedRoute
from steady.server.stats.repeatability import RepeatRun, repeatability
from steady.server.stats.report import build_report
from steady.server.stats.report_data import MetricSpec, RunData
from steady.worker.agent.local import run_local

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).parent / "fixtures"


def _run(script: str, framework: str, seed: int, level: str = "none"):
    r = run_local({"framework": framework, "entrypoint": str(FIXTURES / script), "seed": seed, "determinism": level,
                   "threads": 1, "time_limit_s": 300})
    assert r.ok, r.stderr_tail
    return r


def _repeat(r, key: str = "loss") -> RepeatRun:
    steps, values = r.series.get(key, ([], []))
    return RepeatRun(steps=np.asarray(steps, np.int64), values=np.asarray(values, np.float64),
                     initial_weights=r.digests["initial_weights"], data_order=tuple(r.digests["data_order"]),
                     other_digests={"final_weights": r.digests["final_weights"]})


def test_torch_script_that_only_logs_is_blamed_on_seeding_at_none():
    a, b = _run("torch_log_only.py", "torch", 1), _run("torch_log_only.py", "torch", 1)
    for r in (a, b):  # recorded by the global optimizer hooks
        assert len(r.digests["initial_weights"]) == 64 and len(r.digests["final_weights"]) == 64
        assert r.determinism_applied["initial_weights_digest_source"] == "automatic"
    assert a.digests["initial_weights"] != b.digests["initial_weights"]
    res = repeatability([_repeat(a), _repeat(b)], determinism="none")
    assert res.first_divergent_step == 0 and res.source == "seeding", res.reason
    # seeded: the same code is repeatable, and the automatic digests agree
    c, d = _run("torch_log_only.py", "torch", 1, "seeded"), _run("torch_log_only.py", "torch", 1, "seeded")
    assert c.digests["initial_weights"] == d.digests["initial_weights"] and c.series["loss"] == d.series["loss"]


def test_keras_guide_example_unseeded_is_blamed_on_seeding_at_none():
    a, b = _run("keras_guide_unseeded.py", "tensorflow", 1), _run("keras_guide_unseeded.py", "tensorflow", 1)
    for r in (a, b):  # recorded by the wrapped keras.Model.fit
        assert len(r.digests["initial_weights"]) == 64 and len(r.digests["final_weights"]) == 64
    assert a.digests["initial_weights"] != b.digests["initial_weights"]
    res = repeatability([_repeat(a), _repeat(b)], determinism="none")
    assert res.source == "seeding" and res.first_divergent_step == 0, res.reason


def test_keras_guide_example_ignores_steadys_seed():
    """Verbatim, the guide's example seeds itself with 42: runs of different Steady seeds at
    ``none`` are bit-identical, and the report, comparing them itself, says the code probably
    ignores Steady's seed."""
    runs = {(seed, repeat): _run("keras_guide_example_logged.py", "tensorflow", seed) for seed, repeat in ((1, 0), (1, 1), (2, 0))}
    a, b = runs[1, 0], runs[2, 0]
    assert a.digests["initial_weights"] == b.digests["initial_weights"] is not None
    assert a.digests["final_weights"] == b.digests["final_weights"] is not None
    assert a.series["loss"][0] == [0, 1, 2, 3, 4]  # one loss per epoch
    data = [RunData(run_id=i + 1, seed=seed, repeat=repeat, determinism="none", stack="cpu", fingerprint=r.fingerprint,
                    digests=r.digests, series={k: (np.asarray(st, np.int64), np.asarray(v, np.float64))
                                               for k, (st, v) in r.series.items()})
            for i, ((seed, repeat), r) in enumerate(runs.items())]
    report = build_report(data, [MetricSpec("loss")], rng=np.random.default_rng(0),
                          route=SeedRoute("entrypoint", receives_seed=True))  # ctx.seed reaches it at none
    (rep,) = [v for v in report.verdicts if v.level == "repeatability" and v.metric == "loss"]
    assert rep.verdict == "identical" and rep.details["n_seeds_compared"] == 2
    assert rep.details["seeds_identical"] is True  # derived from the runs, not passed in
    # identical repeats are what a self-seeding script shows at none; different seeds identical are the evidence
    assert rep.details["met_expectation"] is True and SEEDS_IDENTICAL in rep.details["suspicious"]
    (seeds,) = [v for v in report.verdicts if v.level == "seed_stability" and v.metric == "loss"]
    assert seeds.verdict == "seed_has_no_effect"
