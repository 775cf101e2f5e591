"""Regexes over a run's output, compiled for a linear-time engine (RE2).

A run's output is data from an untrusted source, and so is a capture pattern a user submits: with a
backtracking engine (Python's ``re``) a 64 KiB line of ``it 1 it 1 …`` took the default pattern 14.6 s,
and ``(a+)+$`` froze an agent for minutes (``re`` holds the GIL while it matches, so every other run's
heartbeat waited too). RE2 matches in time linear in the line for any pattern, and releases the GIL
while it does. The price is what RE2 cannot run: backreferences (``\\1``, ``(?P=name)``) and
lookarounds (``(?=…)``, ``(?<!…)``); such a pattern is refused at submit with the reason.

``re2`` is imported on first use, not at import: the in-run side imports this contract too, and a
command run with an interpreter of its own need not have it installed.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["PatternError", "compile_linear"]

_UNSUPPORTED_HINT = ("the linear-time engine (RE2) does not run backreferences such as \\1 or (?P=name) "
                     "nor lookarounds such as (?=...), (?!...), (?<=...), (?<!...)")


class PatternError(ValueError):
    """A pattern the engine does not accept; the message says why, in words a user can act on.
    ``unsupported``: valid for a backtracking engine, but it needs what RE2 leaves out."""

    def __init__(self, message: str, *, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


@functools.lru_cache(maxsize=256)
def compile_linear(pattern: str) -> Any:
    """``pattern`` compiled with RE2 (same API as ``re``: ``search``, ``findall``, ``groupindex``…);
    :class:`PatternError` if RE2 refuses it. Cached: every run of a study compiles the same patterns."""
    import re2  # google-re2

    options = re2.Options()
    options.log_errors = False  # the reason goes into the PatternError, not to the agent's stderr
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        if any(marker in reason for marker in ("invalid escape sequence: \\", "invalid perl operator: (?",
                                                "invalid named capture group")) or _looks_unsupported(pattern):
            raise PatternError(f"{reason}; {_UNSUPPORTED_HINT}", unsupported=True) from None
        raise PatternError(reason) from None


def _looks_unsupported(pattern: str) -> bool:
    return any(token in pattern for token in ("(?=", "(?!", "(?<=", "(?<!", "(?P="))
