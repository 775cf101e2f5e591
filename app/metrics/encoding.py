"""Metric series from the wire, exactly.

Listed values spell NaN and ±Inf as the API does (``steady.server.kit.wire``); packed series are decoded
straight into NumPy arrays, bit for bit.
"""

from __future__ import annotations

import numpy as np

from steady.worker.contract.protocol import Series


def series_arrays(series: Series) -> tuple[np.ndarray, np.ndarray]:
    """(steps int64, values float64) of a batch's series, whichever encoding it came in."""
    if series.steps_b64 is not None and series.values_b64 is not None:
        steps_b, values_b = series.packed_bytes()  # decoded once, when the batch was validated
        # read-only views of the request's bytes: nothing downstream writes into them
        steps = np.frombuffer(steps_b, dtype="<i8").astype(np.int64, copy=False)
        values = np.frombuffer(values_b, dtype="<f8").astype(np.float64, copy=False)
        return steps, values
    return np.asarray(series.steps, dtype=np.int64), np.asarray(series.values, dtype=np.float64)
