"""The API's one JSON spelling of non-finite floats: ``"NaN"``, ``"Infinity"``, ``"-Infinity"``
(``null`` only for a value that is absent).

``WireFloat`` is a float that serializes that way to JSON and validates those strings back;
``WireModel`` is the base of response models that carry such floats.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import pydantic
from pydantic import ConfigDict, PlainSerializer, WithJsonSchema

__all__ = ["NONFINITE_SPELLING", "WireFloat", "WireModel", "wire_float"]

NONFINITE_SPELLING = ("NaN", "Infinity", "-Infinity")


def wire_float(x: float) -> float | str:
    """``x``, or its string spelling when it is not finite."""
    if math.isfinite(x):
        return x
    if math.isnan(x):
        return "NaN"
    return "Infinity" if x > 0 else "-Infinity"


_SCHEMA: dict[str, Any] = {
    "anyOf": [{"type": "number"}, {"type": "string", "enum": list(NONFINITE_SPELLING)}],
}

# Validation accepts numbers and the three strings (pydantic parses "NaN"/"Infinity"/"-Infinity"
# as floats); JSON serialization writes non-finite values as those strings.
WireFloat = Annotated[
    float,
    pydantic.Field(allow_inf_nan=True),
    PlainSerializer(wire_float, return_type=Any, when_used="json"),
    WithJsonSchema(_SCHEMA),
]


class WireModel(pydantic.BaseModel):
    """Base of the API's response models: non-finite floats travel as strings."""

    model_config = ConfigDict(ser_json_inf_nan="strings")
