"""Digests without user code, and what attribution makes of them at determinism ``none``: a script
that only logs is blamed on seeding (unseeded initialisation), not on kernels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.stats.expectations import SEEDS_IDENTICAL, repeatability_expectation
from app.stats.repeatability import RepeatRun, repeatability
from worker.local import run_local

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
    ``none`` are bit-identical, and the report says the code probably ignores Steady's seed."""
    a, b = _run("keras_guide_example.py", "tensorflow", 1), _run("keras_guide_example.py", "tensorflow", 2)
    assert a.digests["initial_weights"] == b.digests["initial_weights"] is not None
    assert a.digests["final_weights"] == b.digests["final_weights"] is not None
    verdict = repeatability([_repeat(a), _repeat(b)], determinism="none").verdict
    assert verdict == "identical"
    exp = repeatability_expectation("none", verdict, seeds_identical=True)
    assert exp.met is False and SEEDS_IDENTICAL in exp.suspicious
