"""The event stream between a run subprocess (writer) and the agent (reader).

The child appends one JSON object per line to a file whose path the runner passes in
``STEADY_EVENTS_FILE``. Every line is written with a single unbuffered ``write`` on an
``O_APPEND`` descriptor, so whatever the child wrote before it crashed or was killed is on
disk; the reader only consumes complete lines. Floats are written with ``repr`` precision
(exact round trip); NaN and ±Infinity use Python's JSON spellings.

Event kinds (field ``e``):

``m``            metric points at one step: ``{"e": "m", "s": step, "v": {key: value}}``
``digest``       ``{"e": "digest", "kind": "initial_weights" | "final_weights" |
                 "optimizer_state" | "data_order", "value": hex, "epoch": int | null}``
``fingerprint``  ``{"e": "fingerprint", "value": {...}}``
``determinism``  ``{"e": "determinism", "value": {...}}`` (what was applied)
``info``         ``{"e": "info", "value": {...}}`` (merged into the applied-determinism record)
``result``       ``{"e": "result", "final_metrics": {...}, "timings": {...}}``
``error``        ``{"e": "error", "error": "Type: message", "traceback": "..."}``
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

EVENTS_ENV = "STEADY_EVENTS_FILE"
SPEC_ENV = "STEADY_RUN_SPEC"
CONFIG_FILE_ENV = "STEADY_CONFIG_FILE"  # path of the arm's config file, when its study gives one


class EventWriter:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def write(self, event: dict[str, Any]) -> None:
        if os.getpid() != self._pid:  # a forked DataLoader worker: only the run process reports
            return
        line = (json.dumps(event, separators=(",", ":"), allow_nan=True) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


class EventReader:
    """Reads complete lines appended since the last call; tolerates a torn last line."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        events = []
        for line in lines:
            if not line.strip():
                continue
            try:
                events.append(json.loads(line))
            except ValueError:
                events.append({"e": "corrupt", "line": line[:200].decode("utf-8", "replace")})
        return events
