"""One value per (key, step): the first logged is kept; a different second one is recorded, never sent.

A run's points reach the agent from several channels (the SDK, stdout lines, TensorBoard event files)
and a script may log one step twice: an evaluation line that repeats a training key, a bar redrawn on
a new line, a resumed loop that logs steps again. The server stores what it is sent, so the agent
decides here, for every metric event, which values go on: a value for a (key, step) not seen before
goes on; the same value again is dropped without a word; a different value is dropped and recorded as
a conflict (both values and where each came from), which the run reports with its result.

"The same value" is bitwise the same (NaN equals NaN), or, when either value was read from printed text,
the same at the precision printed: ``0.2954`` on stdout and ``0.29540001`` in a TensorBoard file are one
value, ``2.3100`` and ``2.2950`` are two.

A key the run logs through the SDK is the SDK's: the capture does not send its stdout or TensorBoard
values but holds them beside the event (``"h"``), and a held value that differs from the SDK's at its
step is recorded like any other conflict (kept: the SDK call; dropped: the line or record), whichever of
the two arrived first.

Memory: per point 25 bytes (step, value, origin, digits) in flat arrays, for at most
:data:`MAX_TRACKED_POINTS` points of a run; past that, new points go on unchecked (the server keeps the
first value of a step it is sent twice, so nothing is replaced, but such a duplicate is not recorded).
"""

from __future__ import annotations

import math
import struct
from array import array
from bisect import bisect_left
from typing import Any

from steady.worker.contract.protocol import MAX_CONFLICTS_KEPT, MAX_KEY_LENGTH, MAX_SOURCE_LENGTH

__all__ = ["MAX_TRACKED_POINTS", "ConflictGuard", "same_value"]

MAX_TRACKED_POINTS = 2_000_000
MAX_HELD_WAITING = 100_000  # held values whose step the SDK has not logged yet (it may never)
_CHANNELS = ("sdk", "stdout", "tensorboard")
_CHANNEL_SHIFT, _FILE_SHIFT = 60, 44
_NUMBER_MASK = (1 << _FILE_SHIFT) - 1
_FILE_MASK = (1 << (_CHANNEL_SHIFT - _FILE_SHIFT)) - 1


def _bits(value: float) -> int:
    return struct.unpack("<q", struct.pack("<d", value))[0]


def _rounded(value: float, digits: int) -> float:
    return float(f"{value:.{digits - 1}e}")


def same_value(a: float, b: float, digits_a: int = 0, digits_b: int = 0) -> bool:
    """Whether two logged values are one: bitwise (NaN is NaN), or at the precision printed
    (``digits_*``: significant digits of a value read from text; 0 for an exact value)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if _bits(a) == _bits(b) or a == b:
        return True
    if math.isinf(a) or math.isinf(b):
        return False
    printed = [d for d in (digits_a, digits_b) if d > 0]
    if not printed:
        return False
    digits = min(printed)
    return _rounded(a, digits) == _rounded(b, digits)


class _Series:
    __slots__ = ("digits", "origins", "steps", "values")

    def __init__(self) -> None:
        self.steps = array("q")
        self.values = array("d")
        self.origins = array("q")
        self.digits = array("b")


class ConflictGuard:
    """Admits each (key, step) once per run and remembers the first conflicts and their count."""

    def __init__(self, *, max_points: int = MAX_TRACKED_POINTS, keep: int = MAX_CONFLICTS_KEPT) -> None:
        self.max_points = max_points
        self.keep = keep
        self.tracked = 0
        self.count = 0
        self.first: list[dict[str, Any]] = []
        self._series: dict[str, _Series] = {}
        self._files: list[str] = []
        self._sdk_events = 0
        self._held: dict[tuple[str, int], tuple[float, int, int]] = {}  # (key, step): (value, origin, digits)
        self.restart: dict[str, Any] | None = None  # the output's first step counter that went back (the capture's)
        self.restarts = 0

    def admit(self, event: dict[str, Any]) -> dict[str, float]:
        """The values of a metric event that go on to the server (the others are dropped, and recorded
        when they differ from the value kept)."""
        values: dict[str, Any] = event.get("v") or {}
        channel = event.get("c") or "sdk"
        if channel == "sdk":
            self._sdk_events += 1
        origin = self._origin(channel, event)
        digits: dict[str, int] = event.get("d") or {}
        step = int(event["s"])
        out = {}
        room = self.tracked < self.max_points
        for key, raw in values.items():
            try:
                value = float(raw)
            except (TypeError, ValueError):
                out[key] = raw  # not a number: the server says why it refuses it
                continue
            series = self._series.get(key)
            if room and series is not None and (not series.steps or step > series.steps[-1]):
                # the usual case, a new step after the last one: append (no search)
                series.steps.append(step)
                series.values.append(value)
                series.origins.append(origin)
                series.digits.append(min(int(digits.get(key) or 0), 127))
                self.tracked += 1
                out[key] = raw
            elif self._admit_one(key, step, value, origin, int(digits.get(key) or 0)):
                out[key] = raw
            if self._held and key in out:
                waiting = self._held.pop((key, step), None)
                if waiting is not None:  # a held value came first: compared now, the SDK's value kept
                    held, held_origin, held_digits = waiting
                    if not same_value(value, held, int(digits.get(key) or 0), held_digits):
                        self._record(key, step, value, origin, held, held_origin)
        for key, raw in (event.get("h") or {}).items():
            self._hold(key, step, float(raw), origin, int(digits.get(key) or 0))
        return out

    def _hold(self, key: str, step: int, value: float, origin: int, digits: int) -> None:
        """A captured value of a key the SDK logs: never sent; recorded when it differs from the SDK's value
        at its step (now, or when that value arrives)."""
        series = self._series.get(key)
        if series is not None and series.steps:
            i = bisect_left(series.steps, step)
            if i < len(series.steps) and series.steps[i] == step:
                kept, kept_digits = series.values[i], series.digits[i]
                if not same_value(kept, value, kept_digits, digits):
                    self._record(key, step, kept, series.origins[i], value, origin)
                return
        if len(self._held) < MAX_HELD_WAITING:
            self._held.setdefault((key, step), (value, origin, min(digits, 127)))

    def summary(self) -> dict[str, Any] | None:
        """The run's conflicts as ``protocol.MetricConflicts`` fields (with the output's first restart, which the
        capture sets in :attr:`restart`), or None when there were neither."""
        if not self.count and self.restart is None:
            return None
        out: dict[str, Any] = {"count": self.count, "first": list(self.first)}
        if self.restart is not None:
            out.update(restart=self.restart, restarts=self.restarts)
        return out

    def _admit_one(self, key: str, step: int, value: float, origin: int, digits: int) -> bool:
        series = self._series.get(key)
        if series is None:
            if self.tracked >= self.max_points:
                return True
            series = self._series[key] = _Series()
        steps = series.steps
        if not steps or step > steps[-1]:
            i = len(steps)
        else:
            i = bisect_left(steps, step)
            if i < len(steps) and steps[i] == step:
                kept, kept_digits = series.values[i], series.digits[i]
                if not same_value(kept, value, kept_digits, digits):
                    self._record(key, step, kept, series.origins[i], value, origin)
                return False
        if self.tracked >= self.max_points:
            return True
        if i == len(steps):
            steps.append(step)
            series.values.append(value)
            series.origins.append(origin)
            series.digits.append(min(digits, 127))
        else:  # an earlier step logged late (e.g. a TensorBoard file flushed after the stdout lines)
            steps.insert(i, step)
            series.values.insert(i, value)
            series.origins.insert(i, origin)
            series.digits.insert(i, min(digits, 127))
        self.tracked += 1
        return True

    def _record(self, key: str, step: int, kept: float, kept_origin: int, value: float, origin: int) -> None:
        self.count += 1
        if len(self.first) < self.keep:
            self.first.append({"key": key[:MAX_KEY_LENGTH] or "_", "step": step,
                               "kept": {"value": kept, "source": self._describe(kept_origin)[-MAX_SOURCE_LENGTH:]},
                               "dropped": {"value": value, "source": self._describe(origin)[-MAX_SOURCE_LENGTH:]}})

    def _origin(self, channel: str, event: dict[str, Any]) -> int:
        code = _CHANNELS.index(channel) if channel in _CHANNELS else 0
        number = self._sdk_events if channel == "sdk" else int(event.get("o") or 0)
        file_index = 0
        name = event.get("f")
        if isinstance(name, str):
            if name not in self._files:
                self._files.append(name)
            file_index = min(self._files.index(name) + 1, _FILE_MASK)
        return (code << _CHANNEL_SHIFT) | (file_index << _FILE_SHIFT) | (number & _NUMBER_MASK)

    def _describe(self, origin: int) -> str:
        channel = _CHANNELS[origin >> _CHANNEL_SHIFT]
        file_index = (origin >> _FILE_SHIFT) & _FILE_MASK
        number = origin & _NUMBER_MASK
        if channel == "stdout":
            return f"stdout line {number}"
        if channel == "tensorboard":
            name = self._files[file_index - 1] if file_index else "an event file"
            return f"tensorboard {name} record {number}"
        return f"sdk call {number}"
