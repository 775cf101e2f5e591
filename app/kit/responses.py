"""Responses for large numeric payloads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
from fastapi.responses import JSONResponse

from steady.server.kit import wire

# Arrays orjson writes exactly as it writes the Python numbers of their ``tolist()``: float64 in
# shortest round-trip form, integers, booleans (float32 would come out in float32's shortest form).
_DIRECT = frozenset("?bhilqBHILQ") | {"d"}


def _numbers(obj: Any) -> Any:
    """``wire.plain`` of ``obj``, except that 1-D numpy arrays orjson can write as they are stay
    arrays (no Python object per value); a float array with a non-finite value becomes the list
    with the API's strings."""
    if isinstance(obj, np.ndarray):
        if obj.ndim != 1 or obj.dtype.char not in _DIRECT or not obj.dtype.isnative:
            return wire.plain(obj)
        if obj.dtype.char == "d" and not np.isfinite(obj).all():
            return wire.wire_values(obj)
        return np.ascontiguousarray(obj)
    if isinstance(obj, Mapping):
        return {k: _numbers(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and any(isinstance(v, (np.ndarray, Mapping, list, tuple)) for v in obj):
        return [_numbers(v) for v in obj]
    return wire.plain(obj)


class NumbersJSONResponse(JSONResponse):
    """JSON rendered by orjson: ~15× faster than the standard library on millions of floats.

    Floats come out in their shortest round-trip form (``1e-05`` is written ``0.00001``): the
    same doubles after parsing, not the same bytes as ``json.dumps``. Non-finite floats are the
    API's strings (``steady.server.kit.wire``), not orjson's ``null``: content already spelled that way
    (``steady.server.stats.report.to_plain``) passes through at one ``sum`` per list of floats, and a
    float64 or integer numpy array with only finite values is written from its memory, the same
    bytes as its ``tolist()``.
    """

    def render(self, content: Any) -> bytes:
        return orjson.dumps(_numbers(content), option=orjson.OPT_SERIALIZE_NUMPY)
