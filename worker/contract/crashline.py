"""The line that says why a run crashed, found in the tail of its output.

A run that dies of an uncaught exception prints a traceback and exits with status 1; "exited with
status 1" alone sends the user to the logs for the one line that matters (``RuntimeError: loss is
NaN``). The agent puts that line into the run's error, so ``steady runs``, ``steady submit --wait``
and the study page show it. It lives in the contract so that any reader of a run's tail finds the
same line.
"""

from __future__ import annotations

import re

__all__ = ["crash_line"]

_TRACEBACK = "Traceback (most recent call last):"
# Python's last traceback line: the exception's (qualified) name, then ": message" or nothing.
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?::\s.*|:)?$")
MAX_LINE = 500


def crash_line(tail: str) -> str | None:
    """The exception line of the last Python traceback in ``tail`` (cut to :data:`MAX_LINE`
    characters), or None when the tail holds no complete traceback."""
    start = tail.rfind(_TRACEBACK)
    if start < 0:
        return None
    for line in tail[start + len(_TRACEBACK):].splitlines():
        if not line.strip() or line[0].isspace():  # frames, source lines and carets are indented
            continue
        line = line.rstrip()
        if _EXCEPTION.match(line):
            return line[:MAX_LINE]
        return None
    return None
