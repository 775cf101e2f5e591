"""Caps on free-form values a user stores (parameters, a launch's detail, a run's stack and digests).

A JSON object the API accepts as it is (``dict[str, Any]``) is checked for its size as compact JSON and
for how deeply it nests, before it is stored: every later reader (leases, ``steady status``, reports)
gets a bounded value, and no value nests deeper than the serializers' own limits (pydantic's, the
standard library's recursion), which would make a 500 of every answer that holds it. Both are answered
422 naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

MAX_NESTING = 32  # levels of objects and lists inside a stored value: parameters are rarely over 4


def nesting(value: Any, limit: int = MAX_NESTING) -> int:
    """How many levels of objects and lists ``value`` nests (a scalar: 0), counted without recursion;
    the count stops once it passes ``limit``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest


def check_nesting(value: Any, what: str, limit: int = MAX_NESTING) -> None:
    if nesting(value, limit) > limit:
        raise ValueError(f"{what}: nested more than {limit} levels deep (objects and lists), the limit")


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON (after its depth was checked)."""
    return len(json.dumps(value, separators=(",", ":"), default=str))


def bounded(what: str, max_bytes: int, limit: int = MAX_NESTING) -> Callable[[Any], Any]:
    """A validator (``AfterValidator``) that refuses a value nesting past ``limit`` or over ``max_bytes``
    as compact JSON, with a message naming ``what``."""
    def check(value: Any) -> Any:
        check_nesting(value, what, limit)
        size = json_size(value)
        if size > max_bytes:
            raise ValueError(f"{what}: {size} bytes as JSON, over the limit of {max_bytes}")
        return value

    return check
