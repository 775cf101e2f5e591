"""``to_plain`` converts whole arrays at once; its JSON must stay byte-identical to the
element-by-element conversion it replaced (kept here as the reference)."""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping

import numpy as np

from steady.server.stats.bands import compute_band
from steady.server.stats.report import GroupBand, to_plain


def _reference(obj):
    """The previous implementation, one float at a time (with the API's spelling of NaN and ±Inf)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _reference(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _reference(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return [_reference(v) for v in obj.tolist()]
    if isinstance(obj, (list, tuple)):
        return [_reference(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        if math.isnan(x):
            return "NaN"
        if math.isinf(x):
            return "Infinity" if x > 0 else "-Infinity"
        return x
    if obj is None or isinstance(obj, str):
        return obj
    return str(obj)


def _odd_floats(rng: np.random.Generator, n: int) -> np.ndarray:
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 5e-324, -5e-324, 2.2250738585072014e-308,
                         1.7976931348623157e308, -1.7976931348623157e308, 0.1, 1 / 3, 1e16, 1e-7, 123456789.0])
    nan_payload = np.array([0x7FF8000000000ABC, 0xFFF0000000000001], dtype=np.uint64).view(np.float64)
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n)
    pos = rng.choice(n, specials.size + nan_payload.size, replace=False)
    x[pos] = np.concatenate([specials, nan_payload])
    return x


def _same_json(obj) -> None:
    new, old = to_plain(obj), _reference(obj)
    assert json.dumps(new) == json.dumps(old)
    assert json.dumps(new, allow_nan=False)  # nothing non-finite left as a float


def test_arrays_of_every_kind_match_the_element_by_element_conversion():
    rng = np.random.default_rng(7)
    x = _odd_floats(rng, 2000)
    _same_json(x)
    with np.errstate(over="ignore", invalid="ignore"):  # huge values become ±Inf in the narrow types: more cases to patch
        _same_json(x.astype(np.float32))
        _same_json(x.astype(np.float16))
    _same_json(x.reshape(40, 50))  # 2-D (e.g. quantile rows)
    _same_json(np.zeros((3, 0)))
    _same_json(np.array([], dtype=np.float64))
    _same_json(np.array([True, False]))
    _same_json(np.array([-(2**63), 2**63 - 1], dtype=np.int64))
    _same_json(np.array([2**64 - 1], dtype=np.uint64))
    _same_json(np.array(["a", "b"]))
    _same_json(np.array([1 + 2j]))
    _same_json({"nested": [x[:10], (np.float32(np.nan), np.float64(-np.inf), np.int8(3))], 4: np.bool_(True)})


def test_a_band_with_diverged_and_missing_points_serialises_byte_identically():
    rng = np.random.default_rng(3)
    m = rng.standard_normal((6, 500))
    m[1, 40:] = np.nan  # a run that stopped
    m[2, 7] = -0.0
    m[3, 100:] = np.inf  # diverged
    m[4, 250] = np.nan
    band = compute_band(m, steps=np.arange(500) * 10, diverged=[False, False, False, True, False, False])
    gb = GroupBand(group={"determinism": "seeded", "stack": "s"}, metric="loss", run_ids=(1, 2, 3, 5, 6),
                   excluded_run_ids=(4,), one_run_per_seed=False, downsampled=False, band=band)
    assert json.dumps(gb.to_dict()) == json.dumps(_reference({
        "group": gb.group, "metric": gb.metric, "run_ids": gb.run_ids, "excluded_run_ids": gb.excluded_run_ids,
        "one_run_per_seed": False, "downsampled": False, "coverage": band.coverage, "confidence": band.confidence,
        "steps": band.steps, "n": band.n, "mean": band.mean, "std": band.std, "min": band.min, "max": band.max,
        "quantiles": {f"{q:g}": band.quantiles[i] for i, q in enumerate(band.quantile_levels)},
        "ci_low": band.ci_low, "ci_high": band.ci_high, "ti_low": band.ti_low, "ti_high": band.ti_high}))
    _same_json(band)
