"""Stats results as JSON-safe plain data.

``to_plain`` turns dataclasses, mappings, sequences and numpy values into plain Python data with
NaN and ±Inf as the API's strings "NaN", "Infinity", "-Infinity" (``steady.server.kit.wire``, which the stats
core cannot import; a test keeps the two equal); ``to_data`` does the same but keeps non-finite floats as
floats, for a caller that spells them itself (the API's response models do).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

__all__ = ["to_plain", "to_data", "WIRE", "nonfinite_name"]

WIRE = ("NaN", "Infinity", "-Infinity")  # how ``to_plain`` spells NaN, +Inf, -Inf by default
_AS_IS = frozenset({str, bool, int, type(None)})  # exactly these types (not subclasses) are plain already


def nonfinite_name(x: float) -> str:
    """The API's string for a non-finite float."""
    return WIRE[0] if x != x else WIRE[1] if x > 0 else WIRE[2]


def to_plain(obj, *, spelling: tuple | None = WIRE):
    """Recursively convert dataclasses, mappings, sequences, numpy values to JSON-safe data.
    ``spelling`` gives (NaN, +Inf, -Inf): by default the API's strings; ``None`` keeps them as floats."""
    kind = type(obj)  # most leaves are plain already: returned as the checks below would return them, unchecked
    if kind in _AS_IS or (kind is float and (spelling is None or math.isfinite(obj))):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name), spelling=spelling)
                for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v, spelling=spelling) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return _array_plain(obj, spelling)
    if isinstance(obj, (list, tuple)):
        return [to_plain(v, spelling=spelling) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        if spelling is None or math.isfinite(x):
            return x
        return spelling[0] if math.isnan(x) else spelling[1] if x > 0 else spelling[2]
    if obj is None or isinstance(obj, str):
        return obj
    return str(obj)


def _array_plain(arr: np.ndarray, spelling: tuple | None = WIRE) -> list:
    """``to_plain`` of an array, whole rows at a time: ``tolist()`` gives exactly the Python
    numbers the per-element path gives, and only the non-finite cells are patched (spelled as
    ``spelling``)."""
    if arr.ndim == 0 or arr.dtype.kind not in "biuf":
        return [to_plain(v, spelling=spelling) for v in arr.tolist()]  # object, complex, strings…: element by element
    if arr.ndim > 1:
        return [_array_plain(row, spelling) for row in arr]
    out = arr.tolist()
    if arr.dtype.kind == "f" and spelling is not None:
        bad = np.flatnonzero(~np.isfinite(arr))
        for i in bad.tolist():
            x = out[i]
            out[i] = spelling[0] if x != x else spelling[1] if x > 0 else spelling[2]
    return out



def to_data(obj):
    """``to_plain`` with non-finite floats kept as floats."""
    return to_plain(obj, spelling=None)
