"""Chart payloads: a group's seed band and its runs' lines on one shared, decimated step axis.

The statistics come from the stats core (``compute_bands`` over the completed runs, exactly
as ``GET /api/v1/studies/{id}/bands``, or the same band as the study report computed it);
this module only shapes them for drawing.

Decimation keeps extremes. The aligned step grid is cut into ``max_points // 2`` buckets; each
bucket is drawn at two x positions (its first and last step) and every series — band mean,
min, max, tolerance and confidence limits, each run's line — puts its own minimum and maximum
within the bucket there, in the order they occurred. So every series keeps every bucket's
extremes exactly (a spike in one run survives), all series share one x array (what uPlot
wants), and a point is displaced by less than one bucket (< 0.2 % of the axis at the
default 1000 points). Series shorter than ``max_points`` are sent whole.

Values follow the API's spelling (``steady.server.kit.wire``): a point a run logged as NaN or ±Inf is the
string ``"NaN"`` / ``"Infinity"`` / ``"-Infinity"`` (a bucket with no finite value shows the
first non-finite one logged there), ``null`` is a point a series does not have (a step a run
did not log, a band statistic that cannot be computed, a difference with a non-finite side).
The dashboard draws both as gaps.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from steady.server.kit.errors import judging
from steady.server.models import Run
from steady.server.stats.align import align_series
from steady.server.stats.downsample import bucket_extremes, extreme_indices
from steady.server.stats.repeatability import ulp_distance
from steady.server.stats.report import GroupBand, RunData, compute_bands
from steady.worker.contract.protocol import RunStatus

BAND_FIELDS = ("mean", "min", "max", "ti_low", "ti_high", "ci_low", "ci_high")


def pick_lines(runs: Sequence[Run], max_lines: int) -> list[Run]:
    """At most ``max_lines`` runs to draw: running ones first (they move), then by seed and repeat."""
    ordered = sorted(runs, key=lambda r: (r.status != RunStatus.running, r.seed, r.repeat, r.id))
    return ordered[:max_lines]


def _ints(values: np.ndarray) -> str:
    return "[" + ",".join(map(str, values.tolist())) + "]"


_NONFINITE_JSON = {"nan": '"NaN"', "inf": '"Infinity"', "-inf": '"-Infinity"'}


def _nums(values: np.ndarray, absent: np.ndarray | None = None) -> str:
    """A JSON array of 7-significant-digit numbers, the API's strings for NaN and ±Inf, ``null``
    where ``absent`` (default: NaN, for series whose NaN means "no value") — compact for the wire."""
    text = [f"{v:.7g}" for v in values.tolist()]  # 'nan', 'inf', '-inf' for the non-finite
    if absent is None:
        absent = np.isnan(values)
    for i in np.flatnonzero(absent | ~np.isfinite(values)).tolist():
        text[i] = "null" if absent[i] else _NONFINITE_JSON[text[i]]
    return "[" + ",".join(text) + "]"


def group_chart(
    runs: Sequence[Run],
    series: dict[int, tuple[np.ndarray, np.ndarray]],
    *,
    metric: str,
    coverage: float,
    confidence: float,
    max_points: int,
    max_lines: int,
    first_divergent_step: int | None = None,
    band: GroupBand | None = None,
    n_runs_with_data: int | None = None,
) -> str:
    """The chart of one (determinism, stack) group as JSON text.

    ``runs`` are the group's completed and running runs; ``series`` maps run id to its
    (steps, values) of ``metric``. The band uses the completed runs (one per seed, diverged
    runs excluded, as the API's bands); lines show up to ``max_lines`` runs.

    ``band``: the group's band when already computed (the report's); ``series`` then needs only
    the runs drawn as lines, and ``n_runs_with_data`` counts the runs with data among ``runs``.
    """
    with_data = [r for r in runs if r.id in series and len(series[r.id][0])]
    completed = [r for r in with_data if r.status == RunStatus.completed]
    if band is not None:
        completed = []  # given: not computed here
    if completed:
        data = [RunData(run_id=r.id, seed=r.seed, repeat=r.repeat, determinism=r.determinism, stack="g",
                        series={metric: series[r.id]}) for r in completed]
        with judging(("query", "metric")):
            groups = compute_bands(data, metric=metric, coverage=coverage, confidence=confidence)
        band = groups[0] if groups else None
    lines = pick_lines(with_data, max_lines)
    aligned = align_series({r.id: series[r.id] for r in lines}) if lines else None
    grids = [aligned.steps] if aligned is not None else []
    if band is not None:
        grids.append(np.asarray(band.band.steps, dtype=np.int64))
    grid = np.unique(np.concatenate(grids)) if grids else np.zeros(0, np.int64)

    n_band = len(BAND_FIELDS) if band is not None else 0
    matrix = np.full((n_band + len(lines), grid.size), np.nan)  # every drawn series on the shared grid
    present = np.zeros(matrix.shape, dtype=bool)  # a band statistic that is NaN could not be computed: absent
    if band is not None:
        where = np.searchsorted(grid, band.band.steps)
        for j, name in enumerate(BAND_FIELDS):
            matrix[j, where] = np.asarray(getattr(band.band, name), dtype=np.float64)
            present[j, where] = ~np.isnan(matrix[j, where])
    if aligned is not None:
        where = np.searchsorted(grid, aligned.steps)
        matrix[n_band:, where] = aligned.values
        present[n_band:, where] = aligned.present
    idx, reduced, absent = bucket_extremes(matrix, max_points=max_points, present=present)
    x = grid[idx] if grid.size else grid

    head: dict[str, Any] = {
        "metric": metric,
        "total_steps": int(grid.size),
        "points": int(x.size),
        "downsampled": bool(x.size < grid.size),
        "n_runs": len(runs),
        "n_runs_with_data": len(with_data) if n_runs_with_data is None else n_runs_with_data,
        "n_lines": len(lines),
        "lines_capped": (len(with_data) if n_runs_with_data is None else n_runs_with_data) > len(lines),
        "first_divergent_step": first_divergent_step,
        "band": None,
        "lines": [],
    }
    k = 0
    if band is not None:
        head["band"] = {
            "n": len(band.run_ids),
            "run_ids": list(band.run_ids),
            "excluded_run_ids": list(band.excluded_run_ids),
            "one_run_per_seed": band.one_run_per_seed,
            "coverage": coverage,
            "confidence": confidence,
        }
        k = len(BAND_FIELDS)
    finals = {}
    for r in lines:
        steps, values = series[r.id]
        finite = np.isfinite(values)
        diverged_at = None if finite.all() else int(steps[int(np.argmin(finite))])
        last_finite = values[finite][-1] if finite.any() else None
        if diverged_at is not None:
            before = finite & (steps < diverged_at)
            last_finite = float(values[before][-1]) if before.any() else None
        head["lines"].append({
            "run_id": r.id, "seed": r.seed, "repeat": r.repeat, "status": r.status,
            "diverged_at": diverged_at,
            "diverged_value": last_finite if diverged_at is not None else None,
        })
        if finite.any():
            finals[r.id] = float(values[finite][-1])
    # The numeric arrays are spliced in as compact text; the rest is ordinary JSON.
    body = json.dumps(head, allow_nan=False)[:-1]
    parts = [f',"x":{_ints(x)}']
    if band is not None:
        parts.append(',"series":{' + ",".join(f'"{name}":{_nums(reduced[j], absent[j])}' for j, name in enumerate(BAND_FIELDS))
                     + "}")
    else:
        parts.append(',"series":null')
    parts.append(',"y":[' + ",".join(_nums(reduced[k + i], absent[k + i]) for i in range(len(lines))) + "]")
    return body + "".join(parts) + "}"


def run_chart(steps: np.ndarray, values: np.ndarray, *, key: str, max_points: int) -> str:
    """One run's series of ``key``, decimated keeping extremes, as JSON text."""
    idx, reduced, absent = bucket_extremes(np.asarray(values, dtype=np.float64)[None, :], max_points=max_points)
    finite = np.isfinite(values)
    diverged_at = None if finite.all() else int(steps[int(np.argmin(finite))])
    head = {"key": key, "total_steps": int(len(steps)), "points": int(idx.size),
            "downsampled": bool(idx.size < len(steps)), "diverged_at": diverged_at}
    x = np.asarray(steps, dtype=np.int64)[idx]
    return json.dumps(head)[:-1] + f',"x":{_ints(x)},"y":{_nums(reduced[0], absent[0])}}}'


DIFFERENCE_UNITS = ("abs", "ulp")


def difference_chart(
    runs: Sequence[Run],
    series: dict[int, tuple[np.ndarray, np.ndarray]],
    dtypes: dict[int, str],
    *,
    metric: str,
    unit: str,
    max_points: int,
    resolutions: dict[int, float] | None = None,
) -> str:
    """Each repeat's difference from its seed's reference repeat (the lowest), as JSON text.

    For every seed with two or more repeats that have data, every other repeat minus the
    reference at the steps both logged: the signed difference (``unit="abs"``) or the ULP
    distance in the series' logged dtype (``unit="ulp"``). A series parsed from printed text
    (``resolutions``: run id -> the unit of its last printed digit) carries no binary precision:
    its "ulp" view counts units of the last printed digit instead (``basis`` "printed" on the
    line and the chart), never ULPs of a float it was never stored as. Decimated with
    ``extreme_indices`` per line, plus each line's first nonzero step, so where the repeats
    part and the largest difference stay on the chart. Non-finite points are gaps.
    """
    if unit not in DIFFERENCE_UNITS:
        raise ValueError(f"unit must be one of {DIFFERENCE_UNITS}, got {unit!r}")
    with_data = [r for r in runs if r.id in series and len(series[r.id][0])]
    by_seed: dict[int, list[Run]] = {}
    for r in sorted(with_data, key=lambda r: (r.seed, r.repeat, r.id)):
        by_seed.setdefault(r.seed, []).append(r)
    pairs = [(group[0], other) for group in by_seed.values() if len(group) > 1 for other in group[1:]]

    lines_meta: list[dict[str, Any]] = []
    diffs: list[tuple[np.ndarray, np.ndarray]] = []
    for ref, other in pairs:
        rs, rv = series[ref.id]
        os_, ov = series[other.id]
        steps, ri, oi = np.intersect1d(np.asarray(rs, np.int64), np.asarray(os_, np.int64), return_indices=True)
        a, b = np.asarray(ov, np.float64)[oi], np.asarray(rv, np.float64)[ri]
        finite = np.isfinite(a) & np.isfinite(b)
        printed = max((resolutions or {}).get(other.id) or 0.0, (resolutions or {}).get(ref.id) or 0.0)
        if unit == "abs":
            d = np.where(finite, a - b, np.nan)
        elif printed > 0:
            d = np.where(finite, np.rint((a - b) / printed), np.nan)
        else:
            dtype = dtypes.get(other.id) or dtypes.get(ref.id) or "float64"
            d = np.where(finite, ulp_distance(np.where(finite, a, 0.0), np.where(finite, b, 0.0), dtype)
                         .astype(np.float64), np.nan)
        nonzero = np.flatnonzero(np.nan_to_num(d) != 0)
        mag = np.abs(d[finite]) if finite.any() else np.zeros(0)
        lines_meta.append({
            "run_id": other.id, "reference_run_id": ref.id, "seed": other.seed, "repeat": other.repeat,
            "reference_repeat": ref.repeat, "status": other.status,
            "dtype": dtypes.get(other.id) or "float64",
            "basis": "printed" if printed > 0 and unit == "ulp" else ("binary" if unit == "ulp" else None),
            "resolution": printed or None,
            "first_nonzero_step": int(steps[nonzero[0]]) if nonzero.size else None,
            "max_abs": float(mag.max()) if mag.size else 0.0,
            "max_abs_step": int(steps[finite][int(np.argmax(mag))]) if mag.size else None,
        })
        diffs.append((steps, d))

    grid = np.unique(np.concatenate([s for s, _ in diffs])) if diffs else np.zeros(0, np.int64)
    matrix = np.full((len(diffs), grid.size), np.nan)
    keep: list[np.ndarray] = []
    per_line = max(2, max_points // max(1, len(diffs)))
    for i, (steps, d) in enumerate(diffs):
        where = np.searchsorted(grid, steps)
        matrix[i, where] = d
        keep.append(where[extreme_indices(d, max_points=per_line)])
        nonzero = np.flatnonzero(np.nan_to_num(d) != 0)
        if nonzero.size:  # the step where the repeats part, and the one before it
            keep.append(where[max(0, nonzero[0] - 1): nonzero[0] + 1])
    idx = np.unique(np.concatenate(keep)) if keep else np.zeros(0, np.int64)
    starts = [m["first_nonzero_step"] for m in lines_meta if m["first_nonzero_step"] is not None]
    head = {
        "metric": metric,
        "unit": unit,
        "total_steps": int(grid.size),
        "points": int(idx.size),
        "downsampled": bool(idx.size < grid.size),
        "n_runs_with_data": len(with_data),
        "n_seeds_with_repeats": sum(1 for g in by_seed.values() if len(g) > 1),
        "n_lines": len(lines_meta),
        "identical": bool(lines_meta) and all(m["max_abs"] == 0 for m in lines_meta),
        # values parsed from text: the coarsest last printed digit of any line (equal there is not bitwise)
        "printed_resolution": max((m["resolution"] or 0.0 for m in lines_meta), default=0.0) or None,
        "first_nonzero_step": min(starts) if starts else None,
        "max_abs": max((m["max_abs"] for m in lines_meta), default=0.0),
        # "printed" when any line counts units of its last printed digit rather than ULPs
        "basis": ("printed" if any(m["basis"] == "printed" for m in lines_meta) else "binary") if unit == "ulp" else None,
        "lines": lines_meta,
    }
    body = json.dumps(head, allow_nan=False)[:-1]
    rows = ",".join(_diff_nums(matrix[i, idx], unit) for i in range(len(diffs)))
    return body + f',"x":{_ints(grid[idx])},"y":[{rows}]}}'


def _diff_nums(values: np.ndarray, unit: str) -> str:
    """Differences keep 7 significant digits; ULP counts are integers and are sent whole."""
    if unit == "abs":
        return _nums(values)
    return "[" + ",".join("null" if math.isnan(v) else str(int(v)) for v in values.tolist()) + "]"
