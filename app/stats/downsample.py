"""Downsampling long curves for display while keeping their extremes."""
from __future__ import annotations

import numpy as np

__all__ = ["extreme_indices"]


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
    if int(max_points) != max_points or max_points < 2:
        raise ValueError(f"max_points must be an integer >= 2, got {max_points!r}")
    m = lo.size
    if m <= max_points:
        return np.arange(m)
    buckets = max_points // 2
    edges = np.linspace(0, m, buckets + 1).astype(np.int64)
    width = int(np.max(np.diff(edges)))
    # Pad every bucket to the same width so argmin/argmax run vectorised.
    pos = edges[:-1, None] + np.arange(width)[None, :]
    valid = pos < edges[1:, None]
    pos_c = np.minimum(pos, m - 1)
    lo_b = np.where(valid, lo[pos_c], np.nan)
    hi_b = np.where(valid, hi[pos_c], np.nan)
    lo_b = np.where(np.isnan(lo_b), np.inf, lo_b)
    hi_b = np.where(np.isnan(hi_b), -np.inf, hi_b)
    imin = edges[:-1] + np.argmin(lo_b, axis=1)
    imax = edges[:-1] + np.argmax(hi_b, axis=1)
    return np.unique(np.concatenate([imin, imax]))
