"""Floats on the wire, exactly.

JSON has no NaN or ±Inf: Steady writes them as the strings ``"NaN"``, ``"Infinity"`` and
``"-Infinity"`` (which pydantic reads back as floats). Packed series are decoded straight
into NumPy arrays, bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from worker.protocol import Series


def json_float(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def json_values(values: np.ndarray) -> list[float | str]:
    """A float array for JSON: finite values as numbers (exact), the rest as strings."""
    out: list[Any] = values.tolist()
    if not np.isfinite(values).all():
        for i in np.flatnonzero(~np.isfinite(values)):
            out[i] = json_float(out[i])
    return out


def series_arrays(series: Series) -> tuple[np.ndarray, np.ndarray]:
    """(steps int64, values float64) of a batch's series, whichever encoding it came in."""
    if series.steps_b64 is not None and series.values_b64 is not None:
        steps_b, values_b = series.packed_bytes()  # decoded once, when the batch was validated
        # read-only views of the request's bytes: nothing downstream writes into them
        steps = np.frombuffer(steps_b, dtype="<i8").astype(np.int64, copy=False)
        values = np.frombuffer(values_b, dtype="<f8").astype(np.float64, copy=False)
        return steps, values
    return np.asarray(series.steps, dtype=np.int64), np.asarray(series.values, dtype=np.float64)
