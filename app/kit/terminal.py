"""Text bound for a terminal: names and messages come from users, so their control characters
(escape sequences that could move the cursor, retitle the window or hide text) are removed."""
from __future__ import annotations

import re
from typing import Any

__all__ = ["printable", "printable_tree"]

# C0 controls except tab and newline, DEL, and C1 controls (U+0080–U+009F, e.g. the 8-bit CSI)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: Any) -> str:
    """``str(text)`` without terminal control characters."""
    return _CONTROL.sub("", str(text))


def printable_tree(value: Any) -> Any:
    """Every string in a JSON-like structure made printable (keys too)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_tree(k): printable_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_tree(v) for v in value]
    return value
