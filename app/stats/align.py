"""Aligning run series on steps and detecting diverged runs."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Aligned", "align_series", "first_nonfinite_step", "check_matrix"]


def check_matrix(matrix, *, name: str = "matrix") -> np.ndarray:
    """Validate a ``runs × steps`` float matrix and return it as float64 (no copy if possible)."""
    arr = np.asarray(matrix, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D (runs × steps), got shape {arr.shape}")
    return arr


def _check_series(key, steps, values) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(steps)
    v = np.asarray(values, dtype=np.float64)
    if s.ndim != 1 or v.ndim != 1 or s.shape != v.shape:
        raise ValueError(f"series {key!r}: steps and values must be 1-D of equal length, got {s.shape} and {v.shape}")
    if s.size and not np.issubdtype(s.dtype, np.integer):
        raise ValueError(f"series {key!r}: steps must be integers, got dtype {s.dtype}")
    s = s.astype(np.int64, copy=False)
    if s.size > 1 and np.any(s[1:] <= s[:-1]):  # no np.diff: it overflows for steps 2**63 apart
        raise ValueError(f"series {key!r}: steps must be strictly increasing")
    return s, v


def first_nonfinite_step(steps, values) -> int | None:
    """The first logged step whose value is NaN or ±Inf (the run diverged there), else None."""
    s, v = _check_series("series", steps, values)
    bad = ~np.isfinite(v)
    if not bad.any():
        return None
    return int(s[int(np.argmax(bad))])


@dataclass(frozen=True)
class Aligned:
    """Runs aligned on the union of their steps.

    ``values`` is ``runs × steps`` with NaN where a run did not log the step; ``present`` says
    which cells were logged (so a logged NaN is distinguishable from a missing point);
    ``diverged_at[i]`` is the first non-finite logged step of run i, or None.
    """

    keys: tuple
    steps: np.ndarray  # (steps,) int64, increasing
    values: np.ndarray  # (runs, steps) float64
    present: np.ndarray  # (runs, steps) bool
    diverged_at: tuple  # per run: int | None

    @property
    def diverged(self) -> np.ndarray:
        return np.array([d is not None for d in self.diverged_at], dtype=bool)


def _rows_of_one_matrix(rows: list[np.ndarray]) -> np.ndarray | None:
    """The matrix whose rows, in order, are exactly ``rows`` (views), or None.

    A loader that reads every run into one ``runs × steps`` matrix hands out row views; aligning
    them then needs no copy. The matrix is returned read-only so no consumer can change the runs."""
    base = rows[0].base
    if not (isinstance(base, np.ndarray) and base.ndim == 2 and base.dtype == np.float64
            and base.flags.c_contiguous and base.shape == (len(rows), rows[0].size) and base.size):
        return None
    start, stride = base.__array_interface__["data"][0], base.strides[0]
    for i, r in enumerate(rows):
        if r.base is not base or r.__array_interface__["data"][0] != start + i * stride or r.strides != base.strides[1:]:
            return None
    view = base.view()
    view.flags.writeable = False
    return view


def align_series(series: Mapping[Any, tuple]) -> Aligned:
    """Align ``{key: (steps, values)}`` on the union of steps (missing points are NaN).

    Steps must be strictly increasing integers within each run. Values are kept bit-exact.
    """
    checked = {k: _check_series(k, s, v) for k, s, v in ((k, *sv) for k, sv in series.items())}
    keys = tuple(checked)
    if not keys:
        return Aligned(keys=(), steps=np.zeros(0, np.int64), values=np.zeros((0, 0)),
                       present=np.zeros((0, 0), bool), diverged_at=())
    all_steps = [s for s, _ in checked.values()]
    first = all_steps[0]
    if all(s is first or (s.shape == first.shape and np.array_equal(s, first)) for s in all_steps):
        union = first.copy()
        rows = [v for _, v in checked.values()]
        values = _rows_of_one_matrix(rows)
        if values is None:
            values = np.vstack(rows) if first.size else np.zeros((len(keys), 0))
        present = np.broadcast_to(np.True_, values.shape)  # read-only, no memory
    else:
        union = np.unique(np.concatenate(all_steps))
        values = np.full((len(keys), union.size), np.nan)
        present = np.zeros((len(keys), union.size), dtype=bool)
        for i, (s, v) in enumerate(checked.values()):
            idx = np.searchsorted(union, s)
            values[i, idx] = v
            present[i, idx] = True
    diverged = []
    for s, v in checked.values():
        bad = ~np.isfinite(v)
        diverged.append(int(s[int(np.argmax(bad))]) if bad.any() else None)
    return Aligned(keys=keys, steps=union, values=values, present=present, diverged_at=tuple(diverged))
