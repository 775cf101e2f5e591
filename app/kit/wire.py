"""The API's one JSON spelling of floats, for every response, upload, webhook and chart.

A finite float is a JSON number (shortest round-trip text, so exact). NaN, +Inf and -Inf are
data (a diverged run), and JSON has no token for them: they are the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"`` everywhere, in both directions. ``null`` only ever means
"absent" (no value, not computable, not applicable) — never NaN. No other string is a float.

- ``WireFloat``: the annotated float type of schema fields (defined with the worker's wire
  contract, ``steady.worker.contract.protocol``, which both sides import and which cannot import the server).
- ``WireModel``: the base of the API's pydantic schemas; it also writes non-finite floats in
  untyped (``Any``) fields as the strings.
- ``plain`` / ``dumps``: the same spelling for plain data that is not a model (webhook bodies,
  chart and report payloads), and strict JSON text of it.
- ``wire_values``: a float64 array as a JSON list, fast.

The stats core cannot import this module (it is pure numpy/scipy); ``steady.server.stats.report.to_plain``
writes the same strings, and a test keeps the two in step.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from steady.worker.contract.protocol import NONFINITE, WireFloat, wire_float

__all__ = ["NONFINITE", "NONFINITE_SPELLING", "WireFloat", "WireModel", "dumps", "from_wire", "plain", "wire_float", "wire_values"]

NONFINITE_SPELLING: tuple[str, str, str] = ("NaN", "Infinity", "-Infinity")
"""The three strings, in the order NaN, +Inf, -Inf (the keys of ``NONFINITE``)."""
assert set(NONFINITE_SPELLING) == set(NONFINITE)


class WireModel(BaseModel):
    """Base of the API's schemas: non-finite floats are written as ``"NaN"`` / ``"Infinity"`` /
    ``"-Infinity"`` in JSON, typed (``WireFloat``) or not (``dict[str, Any]``)."""

    model_config = ConfigDict(ser_json_inf_nan="strings")


def from_wire(value: float | str) -> float:
    """A float from its wire form (a number or one of the three strings); ValueError otherwise."""
    if isinstance(value, str):
        try:
            return NONFINITE[value]
        except KeyError:
            raise ValueError(f"not a wire float: {value!r}") from None
    return float(value)


def wire_values(values: np.ndarray) -> list[float | str]:
    """A float array as a JSON list: finite values as (exact) numbers, the rest as the strings."""
    out: list[Any] = values.tolist()
    bad = np.flatnonzero(~np.isfinite(values))
    for i in bad.tolist():
        out[i] = wire_float(out[i])
    return out


def _finite_sum(values: list | tuple) -> bool:
    """True when ``values`` are all numbers and all finite (one C-speed pass; False: look closer)."""
    try:
        return math.isfinite(sum(values))
    except (TypeError, OverflowError):  # None, strings, nested lists, huge ints: element by element
        return False


def plain(obj: Any) -> Any:
    """``obj`` (JSON-like data: dicts, lists, tuples, numbers, strings, None, numpy scalars)
    with every non-finite float written as the API's string. Parts that need no change are
    returned as they are, not copied: a list of a million finite floats costs one ``sum``."""
    if isinstance(obj, float):  # numpy's float64 too (a subclass): a plain float out
        return wire_float(float(obj))
    if isinstance(obj, Mapping):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if obj and isinstance(obj[0], (int, float)) and _finite_sum(obj):
            return obj
        return [plain(v) for v in obj]
    if isinstance(obj, np.floating):  # float32, float16
        return wire_float(float(obj))
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.ndarray):
        return plain(obj.tolist())
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """Strict JSON text of ``obj`` with the API's spelling of non-finite floats (``json.dumps``
    keyword arguments pass through; a bare NaN can never come out: ``allow_nan=False``)."""
    return json.dumps(plain(obj), allow_nan=False, **kwargs)
