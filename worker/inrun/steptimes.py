"""Step-time statistics of a run in bounded memory.

The SDK records the wall time of every training step. The exact values reach the server as
the ``step_time`` metric series (the cost-of-determinism verdict is computed from those); the
run's own summary (steps, mean, median, total) goes into its result's ``timings``. Keeping
every value in a Python list cost 44 B a step for the life of the run; here they go to a
binary file of little-endian float64 (8 B a step on disk, a 64 KiB buffer in memory) and the
summary is computed from that file at the end:

* ``steps``: the number of finite step times;
* ``train_s`` and ``step_time_mean_s``: the correctly rounded sum (``math.fsum``) and it / steps;
* ``step_time_median_s``: the exact median (the middle value, or the mean of the two middle
  values), found by radix selection on the values' order-preserving 64-bit keys: each pass
  over the file counts 16 bits of the key, until the bucket holding the wanted rank is small
  enough to load (NumPy); without NumPy the file is sorted in memory.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Iterator

BUFFER_VALUES = 8192  # values held before they are appended to the file (64 KiB)
CHUNK_VALUES = 1 << 18  # values per read while summarising (2 MiB)
SMALL_BUCKET = 1 << 20  # a bucket this small is loaded and partitioned directly (8 MiB)


class StepTimes:
    """Append-only store of finite step times with an exact, bounded-memory summary."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0
        self._buffer = array("d")
        self._spilled = False

    def add(self, value: float) -> None:
        if math.isfinite(value):
            self._buffer.append(value)
            self.count += 1
            if len(self._buffer) >= BUFFER_VALUES:
                self._spill()

    def _spill(self) -> None:
        if not self._buffer:
            return
        data = self._buffer
        if sys.byteorder != "little":
            data = array("d", data)
            data.byteswap()
        with open(self.path, "ab") as f:
            data.tofile(f)
        self._spilled = True
        self._buffer = array("d")

    def chunks(self) -> Iterator[array]:
        """Every value in the order added, in chunks of at most CHUNK_VALUES."""
        if self._spilled:
            with open(self.path, "rb") as f:
                while True:
                    chunk = array("d")
                    chunk.frombytes(f.read(CHUNK_VALUES * 8))
                    if not chunk:
                        break
                    if sys.byteorder != "little":
                        chunk.byteswap()
                    yield chunk
        if self._buffer:
            yield self._buffer

    def summary(self) -> dict[str, float]:
        """``steps``, ``step_time_mean_s``, ``step_time_median_s``, ``train_s`` (empty when none)."""
        n = self.count
        if not n:
            return {}
        total = math.fsum(v for chunk in self.chunks() for v in chunk)
        if n % 2:
            median = self.kth(n // 2)
        else:
            median = (self.kth(n // 2 - 1) + self.kth(n // 2)) / 2
        return {"steps": float(n), "step_time_mean_s": total / n, "step_time_median_s": median, "train_s": total}

    def kth(self, k: int) -> float:
        """The k-th smallest value (0-based), exactly."""
        if not 0 <= k < self.count:
            raise IndexError(k)
        try:
            import numpy as np
        except ImportError:  # pragma: no cover - the SDK runs without numpy too
            return sorted(v for chunk in self.chunks() for v in chunk)[k]
        return _radix_select(self, k, np)


def _keys(values, np):
    """Order-preserving uint64 keys of float64 values (NaN excluded): negative values have
    all bits flipped, others get the sign bit set."""
    bits = np.frombuffer(values, dtype=np.float64).view(np.uint64) if len(values) else np.empty(0, np.uint64)
    negative = (bits >> np.uint64(63)).astype(bool)
    return np.where(negative, ~bits, bits | np.uint64(1 << 63))


def _radix_select(store: StepTimes, k: int, np) -> float:
    prefix, shift = 0, 64
    while True:
        shift -= 16
        counts = np.zeros(1 << 16, dtype=np.int64)
        for chunk in store.chunks():
            keys = _keys(chunk, np)
            if shift < 48:
                keys = keys[(keys >> np.uint64(shift + 16)) == np.uint64(prefix)]
            counts += np.bincount(((keys >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.int64), minlength=1 << 16)
        cumulative = np.cumsum(counts)
        bucket = int(np.searchsorted(cumulative, k, side="right"))
        k -= int(cumulative[bucket - 1]) if bucket else 0
        prefix = (prefix << 16) | bucket
        if counts[bucket] <= SMALL_BUCKET or shift == 0:
            picked = []
            for chunk in store.chunks():
                values = np.frombuffer(chunk, dtype=np.float64)
                picked.append(values[(_keys(chunk, np) >> np.uint64(shift)) == np.uint64(prefix)])
            inside = np.concatenate(picked)
            return float(np.partition(inside, k)[k])
