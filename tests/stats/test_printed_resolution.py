"""Values parsed from printed text carry no binary precision: their differences are counted in the
last printed digit, never in ULPs (``steady.server.stats.repeatability``, ``stack_pairs``)."""

from __future__ import annotations

import numpy as np

from steady.server.stats.repeatability import RepeatRun, repeatability, size_phrase
from steady.server.stats.stack_pairs import stack_pairs

STEPS = np.arange(3)


def _run(values, resolution=None) -> RepeatRun:
    return RepeatRun(steps=STEPS, values=np.array(values), resolution=resolution)


def test_text_values_differ_in_printed_digits_not_ulps():
    r = repeatability([_run([0.5, 0.8123, 0.9]), _run([0.5, 0.8126, 0.9], 1e-4)])
    assert r.max_ulps is None and r.resolution == 1e-4
    assert "max |Δ| 0.0003 (3 in the last printed digit, 0.0001, of values parsed from text)" in r.reason, r.reason
    assert "ULP" not in r.reason
    binary = repeatability([_run([0.5, 0.8123, 0.9]), _run([0.5, 0.8126, 0.9])])
    assert binary.max_ulps > 10**12 and "float64 ULPs" in binary.reason  # what printed text used to read as


def test_pairs_on_two_stacks_carry_the_coarsest_resolution():
    pairs = stack_pairs({0: (_run([1.0, 2.0, 3.0], 1e-4), _run([1.0, 2.0, 3.01], 1e-2)),
                         1: (_run([1.0, 2.0, 3.0]), _run([1.0, 2.0, 3.0]))})
    assert pairs.max_ulps is None and pairs.resolution == 1e-2


def test_size_phrase():
    assert size_phrase(0.25, 7, None, "float32") == "max |Δ| 0.25, 7 float32 ULPs"
    assert size_phrase(0.02, None, 0.01).startswith("max |Δ| 0.02 (2 in the last printed digit, 0.01")
    assert "∞ in the last printed digit" in size_phrase(float("inf"), None, 1.0)
