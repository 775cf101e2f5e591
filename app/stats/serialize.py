"""Stats results as JSON-safe plain data.

``to_plain`` turns dataclasses, mappings, sequences and numpy values into plain Python data with
NaN as None and ±Inf as "inf"/"-inf"; ``to_data`` does the same but keeps non-finite floats as
floats, for a caller that spells them itself (the API's response models do).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

__all__ = ["to_plain", "to_data"]


def to_plain(obj, *, keep_nonfinite: bool = False):
    """Recursively convert dataclasses, mappings, sequences, numpy values to JSON-safe data
    (NaN → None, ±Inf → "inf"/"-inf"; kept as floats with ``keep_nonfinite``)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name), keep_nonfinite=keep_nonfinite)
                for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v, keep_nonfinite=keep_nonfinite) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return _array_plain(obj, keep_nonfinite)
    if isinstance(obj, (list, tuple)):
        return [to_plain(v, keep_nonfinite=keep_nonfinite) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        if keep_nonfinite:
            return x
        if math.isnan(x):
            return None
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if obj is None or isinstance(obj, str):
        return obj
    return str(obj)


_NONFINITE = {True: "inf", False: "-inf"}


def _array_plain(arr: np.ndarray, keep_nonfinite: bool = False) -> list:
    """``to_plain`` of an array, whole rows at a time: ``tolist()`` gives exactly the Python
    numbers the per-element path gives, and only the non-finite cells are patched (NaN → None,
    ±Inf → "inf"/"-inf")."""
    if arr.ndim == 0 or arr.dtype.kind not in "biuf":
        return [to_plain(v, keep_nonfinite=keep_nonfinite) for v in arr.tolist()]  # object, complex, strings…: element by element
    if arr.ndim > 1:
        return [_array_plain(row, keep_nonfinite) for row in arr]
    out = arr.tolist()
    if arr.dtype.kind == "f" and not keep_nonfinite:
        bad = np.flatnonzero(~np.isfinite(arr))
        for i in bad.tolist():
            x = out[i]
            out[i] = None if x != x else _NONFINITE[x > 0]
    return out



def to_data(obj):
    """``to_plain`` with non-finite floats kept as floats."""
    return to_plain(obj, keep_nonfinite=True)
