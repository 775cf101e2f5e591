"""``steady.server.kit.wire``: the one JSON spelling of floats ("NaN", "Infinity", "-Infinity"; null only for absent)."""

from __future__ import annotations

import json
import math

import numpy as np
import orjson
import pytest
from pydantic import TypeAdapter, ValidationError

from steady.server.kit.responses import NumbersJSONResponse
from steady.server.stats.report import to_plain
from steady.server.kit.wire import NONFINITE, WireFloat, WireModel, dumps, from_wire, plain, wire_float, wire_values
from tests.api.helpers import bare_constant


class Point(WireModel):
    value: WireFloat
    maybe: WireFloat | None = None
    extra: dict = {}


def _loads(text: str | bytes):
    return json.loads(text, parse_constant=bare_constant)


@pytest.mark.parametrize("x, text", [(math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity")])
def test_non_finite_values_round_trip_as_the_three_strings(x: float, text: str):
    dumped = Point(value=x, maybe=x, extra={"k": [x]}).model_dump_json()
    assert _loads(dumped) == {"value": text, "maybe": text, "extra": {"k": [text]}}
    back = Point.model_validate_json(dumped)
    for got in (back.value, back.maybe):
        assert math.isnan(got) if math.isnan(x) else got == x
    assert Point.model_validate({"value": text}).model_dump()["value"] is not None  # Python mode keeps the float


def test_finite_values_are_plain_exact_numbers():
    for x in (0.1, -0.0, 5e-324, 1.7976931348623157e308, 1 / 3):
        assert Point.model_validate_json(Point(value=x).model_dump_json()).value.hex() == x.hex()


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "Inf", "infinity", "1.5", "", " NaN"])
def test_no_other_string_is_a_float(bad: str):
    with pytest.raises(ValidationError, match="one of 'NaN', 'Infinity', '-Infinity'"):
        Point.model_validate({"value": bad})
    with pytest.raises(ValueError):
        from_wire(bad)


def test_null_is_absent_never_a_number():
    with pytest.raises(ValidationError):
        Point.model_validate({"value": None})
    assert Point.model_validate({"value": 1.0, "maybe": None}).maybe is None
    assert _loads(Point(value=1.0).model_dump_json())["maybe"] is None


def test_bare_tokens_of_old_clients_are_still_read():
    assert math.isnan(Point.model_validate_json('{"value": NaN}').value)
    assert Point.model_validate_json('{"value": -Infinity}').value == -math.inf


def test_outside_a_wire_model_the_type_still_spells_them():
    adapter = TypeAdapter(dict[str, WireFloat])
    assert adapter.dump_json({"a": math.nan, "b": 2.5}) == b'{"a":"NaN","b":2.5}'
    assert adapter.dump_python({"a": math.inf}, mode="json") == {"a": "Infinity"}


def test_plain_and_dumps_spell_nested_and_numpy_values_and_never_write_a_bare_token():
    data = {"a": [1.0, math.nan], "b": (np.float64(-np.inf), np.int64(3)), "c": {"d": np.array([np.inf, 0.5])},
            "e": None, "f": "text"}
    assert plain(data) == {"a": [1.0, "NaN"], "b": ["-Infinity", 3], "c": {"d": ["Infinity", 0.5]}, "e": None,
                           "f": "text"}
    assert _loads(dumps(data)) == plain(data)
    finite = [float(i) for i in range(1000)]
    assert plain(finite) is finite  # nothing to change: not copied
    assert plain([10**400, 1.0]) == [10**400, 1.0]  # a sum that is no float does not break the check
    assert plain([1e308, 1e308, math.inf]) == [1e308, 1e308, "Infinity"]  # an overflowing sum looks closer


def test_wire_values_matches_the_type():
    x = np.array([0.25, np.nan, np.inf, -np.inf, -0.0])
    assert wire_values(x) == [0.25, "NaN", "Infinity", "-Infinity", -0.0]
    assert [wire_float(v) for v in x.tolist()] == wire_values(x)


def test_the_stats_core_writes_the_same_spelling():
    # steady.server.stats cannot import steady.server.kit.wire: the two spellings are kept equal here
    for text, x in NONFINITE.items():
        assert to_plain(x) == text == wire_float(x)
        assert to_plain(np.array([x, 1.0])) == [text, 1.0]


def test_numbers_response_spells_non_finite_floats_instead_of_null():
    body = NumbersJSONResponse({"x": [1.0, math.nan], "y": np.float64(np.inf), "z": None}).body
    assert _loads(body) == {"x": [1.0, "NaN"], "y": "Infinity", "z": None}
    assert orjson.loads(body)["z"] is None


def test_numbers_response_writes_arrays_as_the_bytes_of_their_python_numbers():
    """Arrays rendered from their memory give the bytes of the same content turned into Python
    numbers first (``to_plain``): float64 over the whole exponent range, signed zeros, subnormals,
    NaN and ±Inf (as the strings), integers, booleans, float32 and 2-D arrays (element by element)."""
    rng = np.random.default_rng(7)
    wide = rng.standard_normal(20_000) * 10.0 ** rng.integers(-320, 308, 20_000)
    special = np.array([0.0, -0.0, 5e-324, -2.2250738585072014e-308, 1.7976931348623157e308, 1e16, 1e-7, 0.1,
                        2.0**53, 123456789012345678.0, 1e21, -1e22])
    with_nonfinite = wide.copy()
    with_nonfinite[rng.integers(0, wide.size, 30)] = rng.choice([np.nan, np.inf, -np.inf], 30)
    content = {
        "wide": wide, "special": special, "nonfinite": with_nonfinite, "strided": wide[::3],
        "steps": np.arange(0, 10**12, 10**7, dtype=np.int64), "n": rng.integers(0, 300, 500).astype(np.int32),
        "u": np.array([2**64 - 1, 0], dtype=np.uint64), "flags": rng.random(50) < 0.5,
        "f32": rng.standard_normal(50).astype(np.float32), "matrix": rng.standard_normal((3, 4)),
        "groups": [{"quantiles": {"0.5": with_nonfinite[:100], "0.95": wide[:100]}, "run_ids": (1, 2),
                    "coverage": 0.9, "none": None, "nan": math.nan}],
        "plain": [1.0, math.inf], "empty": np.array([], dtype=np.float64),
    }
    assert NumbersJSONResponse(content).body == orjson.dumps(plain(to_plain(content)))
