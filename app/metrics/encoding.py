"""Floats on the wire, exactly.

JSON has no NaN or ±Inf: Steady writes them as the strings ``"NaN"``, ``"Infinity"`` and
``"-Infinity"`` (which pydantic reads back as floats). Packed series are decoded straight
into NumPy arrays, bit for bit.
"""

from __future__ import annotations

import base64
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
        steps = np.frombuffer(base64.b64decode(series.steps_b64), dtype="<i8").astype(np.int64)
        values = np.frombuffer(base64.b64decode(series.values_b64), dtype="<f8").astype(np.float64)
        return steps, values
    return np.asarray(series.steps, dtype=np.int64), np.asarray(series.values, dtype=np.float64)
