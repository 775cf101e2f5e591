"""The difference payload without a browser: decimation keeps where repeats part and the largest gap."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np

from steady.server.dashboard.charts import difference_chart


def _run(id_, seed, repeat):
    return SimpleNamespace(id=id_, seed=seed, repeat=repeat, status="completed")


def test_decimated_difference_keeps_first_nonzero_step_and_max():
    steps = np.arange(20_000)
    base = np.exp(-steps / 5000.0)
    other = base.copy()
    other[12_345:] += 1e-7
    other[17_000] += 5e-6  # one spike
    runs = [_run(1, 0, 0), _run(2, 0, 1), _run(3, 1, 0)]  # seed 1 has a single repeat: no line
    d = json.loads(difference_chart(runs, {1: (steps, base), 2: (steps, other), 3: (steps, base)}, {},
                                    metric="loss", unit="abs", max_points=400))
    assert d["downsampled"] and d["points"] <= 402 and d["n_lines"] == 1
    assert d["first_nonzero_step"] == 12_345 and d["lines"][0]["reference_run_id"] == 1
    x, y = np.array(d["x"]), np.array(d["y"][0], dtype=float)
    assert 12_345 in x and y[x == 12_344][0] == 0 and y[x == 12_345][0] > 0
    assert np.nanmax(y) == float(f"{d['max_abs']:.7g}") and d["lines"][0]["max_abs_step"] == 17_000


def test_ulps_in_the_logged_dtype_and_identical_repeats():
    steps = np.arange(10)
    a = np.full(10, 0.75)
    b = a.copy()
    b[5:] = np.nextafter(np.float32(0.75), np.float32(1), dtype=np.float32)
    runs = [_run(1, 0, 0), _run(2, 0, 1)]
    d = json.loads(difference_chart(runs, {1: (steps, a), 2: (steps, b)}, {1: "float32", 2: "float32"},
                                    metric="loss", unit="ulp", max_points=100))
    assert d["y"][0] == [0] * 5 + [1] * 5 and d["first_nonzero_step"] == 5 and not d["identical"]
    same = json.loads(difference_chart(runs, {1: (steps, a), 2: (steps, a.copy())}, {}, metric="loss", unit="ulp",
                                       max_points=100))
    assert same["identical"] and same["first_nonzero_step"] is None


def test_values_parsed_from_text_count_printed_digits_not_ulps():
    """stdout values printed with four decimals differ by 0.0002: two units of the last printed digit,
    not the ~10^12 float64 ULPs between the parsed numbers."""
    steps = np.arange(4)
    a = np.array([2.3101, 2.2004, 2.1007, 2.0])
    b = a + np.array([0.0, 0.0, 0.0002, 0.0003])
    runs = [_run(1, 0, 0), _run(2, 0, 1)]
    d = json.loads(difference_chart(runs, {1: (steps, a), 2: (steps, b)}, {}, metric="loss", unit="ulp",
                                    max_points=100, resolutions={1: 1e-4, 2: 1e-4}))
    assert d["basis"] == "printed" and d["lines"][0]["basis"] == "printed" and d["lines"][0]["resolution"] == 1e-4
    assert d["y"][0] == [0, 0, 2, 3] and d["max_abs"] == 3 and d["first_nonzero_step"] == 2
    binary = json.loads(difference_chart(runs, {1: (steps, a), 2: (steps, b)}, {}, metric="loss", unit="ulp",
                                         max_points=100))
    assert binary["basis"] == "binary" and binary["max_abs"] > 1e9  # the same floats, counted as binary


def test_identical_repeats_parsed_from_text_carry_their_printed_resolution():
    """Equal to the last printed digit is not bitwise: the payload names the digit, and the page says so."""
    steps = np.arange(4)
    a = np.array([2.31, 2.2, 2.1, 2.0])
    runs = [_run(1, 0, 0), _run(2, 0, 1)]
    d = json.loads(difference_chart(runs, {1: (steps, a), 2: (steps, a.copy())}, {}, metric="loss", unit="abs",
                                    max_points=100, resolutions={1: 0.01, 2: 0.01}))
    assert d["identical"] and d["printed_resolution"] == 0.01
    binary = json.loads(difference_chart(runs, {1: (steps, a), 2: (steps, a.copy())}, {}, metric="loss", unit="abs",
                                         max_points=100))
    assert binary["identical"] and binary["printed_resolution"] is None
