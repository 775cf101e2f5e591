"""Downsampling long curves for display while keeping their extremes."""
from __future__ import annotations

import numpy as np

__all__ = ["bucket_extremes", "extreme_indices"]


def _buckets(m: int, max_points: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``max_points // 2`` contiguous buckets of ``range(m)``: their edges, and every bucket's
    positions padded to the widest bucket (``buckets × width``, clipped to the last index) with
    the mask of the real ones, so that argmin/argmax over a bucket run vectorised."""
    buckets = max_points // 2
    edges = np.linspace(0, m, buckets + 1).astype(np.int64)
    width = int(np.max(np.diff(edges)))
    pos = edges[:-1, None] + np.arange(width)[None, :]
    valid = pos < edges[1:, None]
    return edges, np.minimum(pos, m - 1), valid


def _check_max_points(max_points: int) -> None:
    if int(max_points) != max_points or max_points < 2:
        raise ValueError(f"max_points must be an integer >= 2, got {max_points!r}")


def extreme_indices(low, high=None, *, max_points: int) -> np.ndarray:
    """Indices (sorted, unique) of at most ``max_points`` points that keep each bucket's extremes.

    The series is cut into ``max_points // 2`` contiguous buckets; each bucket keeps the index
    of its minimum of ``low`` and of its maximum of ``high`` (``high`` defaults to ``low``), in
    step order — the "min/max per bucket" decimation used by plotting libraries (cf. the M4
    aggregation of Jugel et al., VLDB 2014, without first/last). NaNs are ignored within a
    bucket; an all-NaN bucket keeps its first index. Returns all indices when the series is
    already short enough.
    """
    lo = np.asarray(low, dtype=np.float64)
    hi = lo if high is None else np.asarray(high, dtype=np.float64)
    if lo.ndim != 1 or hi.shape != lo.shape:
        raise ValueError(f"low and high must be 1-D of equal length, got {lo.shape} and {hi.shape}")
    _check_max_points(max_points)
    m = lo.size
    if m <= max_points:
        return np.arange(m)
    edges, pos, valid = _buckets(m, max_points)
    lo_b = np.where(valid, lo[pos], np.nan)
    hi_b = np.where(valid, hi[pos], np.nan)
    lo_b = np.where(np.isnan(lo_b), np.inf, lo_b)
    hi_b = np.where(np.isnan(hi_b), -np.inf, hi_b)
    imin = edges[:-1] + np.argmin(lo_b, axis=1)
    imax = edges[:-1] + np.argmax(hi_b, axis=1)
    return np.unique(np.concatenate([imin, imax]))


def bucket_extremes(matrix, *, max_points: int, present=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decimate ``series × steps`` to ``series × ≤max_points`` on one shared x axis, keeping each
    bucket's minimum and maximum of every series (the buckets of ``extreme_indices``).

    ``present`` (default: every cell) marks the cells a series has. Returns ``(x, values,
    absent)``: ``x`` holds the grid positions of each bucket's first and last step (``2 ×
    buckets``, ascending); ``values[i]`` holds series ``i``'s bucket extremes in step order (the
    one that comes first in the bucket at the bucket's first position). Non-finite cells take no
    part in the extremes: a bucket where a series has no finite value gives the first non-finite
    value it logged there (a diverged run stays visible), or is ``absent`` (True) when the series
    has no cell there at all. A series already short enough comes back whole.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"matrix must be 2-D (series × steps), got shape {matrix.shape}")
    _check_max_points(max_points)
    n_series, m = matrix.shape
    present = np.ones(matrix.shape, dtype=bool) if present is None else np.asarray(present, dtype=bool)
    if present.shape != matrix.shape:
        raise ValueError(f"present must have the matrix's shape {matrix.shape}, got {present.shape}")
    if m <= max_points:
        return np.arange(m), matrix, ~present
    edges, pos, valid = _buckets(m, max_points)
    buckets = edges.size - 1
    out = np.empty((n_series, 2 * buckets))
    absent = np.zeros((n_series, 2 * buckets), dtype=bool)
    for i in range(n_series):  # one series at a time: temporaries of one row, not of the matrix
        raw = np.where(valid, matrix[i][pos], np.nan)  # buckets × width
        finite = np.isfinite(raw)
        cells = np.where(finite, raw, np.nan)
        missing = ~finite
        empty = missing.all(axis=1)
        lo = np.argmin(np.where(missing, np.inf, cells), axis=1)
        hi = np.argmax(np.where(missing, -np.inf, cells), axis=1)
        first, second = np.minimum(lo, hi), np.maximum(lo, hi)
        v_first = np.take_along_axis(cells, first[:, None], axis=1)[:, 0]
        v_second = np.take_along_axis(cells, second[:, None], axis=1)[:, 0]
        if empty.any():  # no finite value: the first non-finite one the series has there, else absent
            logged = valid & present[i][pos] & ~finite
            has = logged.any(axis=1)
            fill = np.where(has, np.take_along_axis(raw, np.argmax(logged, axis=1)[:, None], axis=1)[:, 0], np.nan)
            v_first[empty] = v_second[empty] = fill[empty]
            absent[i, 0::2] = absent[i, 1::2] = empty & ~has
        out[i, 0::2], out[i, 1::2] = v_first, v_second
    x = np.empty(2 * buckets, dtype=np.int64)
    x[0::2], x[1::2] = edges[:-1], edges[1:] - 1
    return x, out, absent
