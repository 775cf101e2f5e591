"""Text bound for a terminal: names and messages come from users, so their control characters
(escape sequences that could move the cursor, retitle the window or hide text) are removed, and so are
the invisible characters that reorder or hide text: bidirectional controls (a right-to-left override
makes "report.txt" of "txt.troper") and zero-width characters."""
from __future__ import annotations

import re
from typing import Any

__all__ = ["printable", "printable_output", "printable_tree"]

# C0 controls except tab and newline, DEL, and C1 controls (U+0080–U+009F, e.g. the 8-bit CSI); the Arabic
# letter mark, zero-width space, non-joiner, joiner and the LTR/RTL marks (U+200B–U+200F), the embeddings and
# overrides (U+202A–U+202E), the word joiner and invisible operators (U+2060–U+2064), the isolates
# (U+2066–U+2069), and the zero-width no-break space (U+FEFF)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def printable(text: Any) -> str:
    """``str(text)`` without terminal control characters."""
    return _CONTROL.sub("", str(text))


# Whole escape sequences: CSI (colours, cursor moves: ESC [ ... final), OSC (titles, links: ESC ] ... BEL
# or ESC \\), and the two-character ones; removing only the ESC would leave "[31m" in the text.
_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x9b[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
_REDRAWN = re.compile(r"[^\n]*\r(?!\n)")


def printable_output(text: Any) -> str:
    """A run's output as a person reads it: escape sequences removed, a line redrawn with a carriage
    return (a progress bar) shown as it was last drawn, then :func:`printable`."""
    text = _ESCAPE.sub("", str(text))
    return printable(_REDRAWN.sub("", text))


def printable_tree(value: Any) -> Any:
    """Every string in a JSON-like structure made printable (keys too)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_tree(k): printable_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_tree(v) for v in value]
    return value
