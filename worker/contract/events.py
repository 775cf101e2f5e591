"""The event stream between a run subprocess (writer) and the agent (reader).

The child appends one JSON object per line to a file whose path the runner passes in
``STEADY_EVENTS_FILE``. Every line is written with a single unbuffered ``write`` on an
``O_APPEND`` descriptor, so whatever the child wrote before it crashed or was killed is on
disk; the reader only consumes complete lines. Floats are written with ``repr`` precision
(exact round trip); NaN and ±Infinity use Python's JSON spellings.

Event kinds (field ``e``):

``m``            metric points at one step: ``{"e": "m", "s": step, "v": {key: value}}``; the agent
                 appends those it captures itself with ``"c": "tensorboard" | "stdout"``
                 (:mod:`steady.worker.agent.capture`); ``"t": {key: dtype}`` the type a value was logged
                 in, ``"r": {key: unit}`` the last printed digit's unit of a value parsed from text
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
from collections.abc import Iterator
from typing import Any

from steady.worker.contract import runfiles

EVENTS_ENV = "STEADY_EVENTS_FILE"
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=True)  # = json.dumps(..., separators, allow_nan), built once
SPEC_ENV = "STEADY_RUN_SPEC"
CONFIG_FILE_ENV = "STEADY_CONFIG_FILE"  # path of the arm's config file, when its study gives one


class EventWriter:
    """Appends events to ``path``; never through a symlink and only to a regular file (the agent
    appends captured metrics to a file the run could replace: :mod:`steady.worker.contract.runfiles`)."""

    def __init__(self, path: str) -> None:
        path = os.path.abspath(path)
        self._fd = runfiles.open_fd(path, os.path.dirname(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def write(self, event: dict[str, Any]) -> None:
        if os.getpid() != self._pid:  # a forked DataLoader worker: only the run process reports
            return
        line = (_ENCODER.encode(event) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


READ_CHUNK_BYTES = 1 << 18  # what one bounded read takes from the file (~3,500 metric events)
# The longest event line read: a metric event of a few thousand keys fits. A longer line (an unterminated
# 600 MB one the run wrote) is skipped to its end, counted in EventReader.oversized, and never held: the
# reader keeps at most this many bytes of a line however long it grows.
MAX_EVENT_LINE_BYTES = 1 << 20
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def step_in_range(step: Any) -> bool:
    """Whether ``step`` is an int the wire and the storage hold (int64); a bool is not a step."""
    return isinstance(step, int) and not isinstance(step, bool) and INT64_MIN <= step <= INT64_MAX
_METRIC_PREFIX = b'{"e":"m",'  # how EventWriter starts every metric line (compact separators, "e" first)


def _parse(line: bytes) -> dict[str, Any]:
    try:
        return json.loads(line)
    except ValueError:
        return {"e": "corrupt", "line": line[:200].decode("utf-8", "replace")}


class EventReader:
    """Reads complete lines appended since the last call; tolerates a torn last line.

    The file is the buffer: ``read_new(max_bytes=...)`` takes at most that many bytes, so a
    reader that falls behind a fast writer holds a bounded window in memory and resumes from
    :attr:`offset` (the byte after the last complete line it returned) on the next call. A line over
    ``max_line_bytes`` is dropped as it is read (the bytes up to its newline are skipped, never joined),
    so each read costs its own size whatever the run wrote.
    """

    def __init__(self, path: str, offset: int = 0, *, max_line_bytes: int = MAX_EVENT_LINE_BYTES) -> None:
        self.path = os.path.abspath(path)
        self._offset = offset  # bytes read from the file so far (complete lines + the partial one)
        self._partial = b""
        self._skipping = False  # inside a line over the bound: drop bytes up to its newline
        self.max_line_bytes = max_line_bytes
        self.oversized = 0  # lines over the bound, skipped
        self.refused: str | None = None  # why the file is not read (a symlink, a FIFO…), once it was refused

    @property
    def offset(self) -> int:
        """File offset of the first byte not yet returned as part of a complete line (or skipped)."""
        return self._offset - len(self._partial)

    @property
    def consumed(self) -> int:
        """Bytes taken from the file so far: grows on every read that found data, lines or not."""
        return self._offset

    def unread_bytes(self) -> int:
        """Bytes in the file after :attr:`offset` (0 when the file does not exist yet)."""
        if self.refused is not None:
            return 0
        return max(0, runfiles.size(self.path) - self.offset)

    def read_new(self, max_bytes: int | None = None) -> list[dict[str, Any]]:
        """Complete events appended since the last call; at most about ``max_bytes`` of them
        (``None``: everything, for callers that keep it all anyway)."""
        try:
            chunk = _read(self.path, self._offset, max_bytes)
        except runfiles.UnsafeFileError as exc:
            self.refused = exc.reason
            return []
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        if self._skipping:
            cut = chunk.find(b"\n")
            if cut < 0:
                return []
            chunk, self._skipping = chunk[cut + 1:], False
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        if len(self._partial) > self.max_line_bytes:
            self._partial, self._skipping = b"", True
            self.oversized += 1
        out = []
        for line in lines:
            if len(line) > self.max_line_bytes:
                self.oversized += 1
            elif line.strip():
                out.append(_parse(line))
        return out


def _read(path: str, offset: int, max_bytes: int | None) -> bytes:
    if max_bytes is not None:
        return runfiles.read_at(path, os.path.dirname(path), offset, max(1, int(max_bytes)))
    with os.fdopen(runfiles.open_fd(path, os.path.dirname(path)), "rb") as f:
        f.seek(offset)
        return f.read()


def control_events(path: str, offset: int = 0, *, chunk_bytes: int = READ_CHUNK_BYTES,
                   max_line_bytes: int = MAX_EVENT_LINE_BYTES) -> Iterator[dict[str, Any]]:
    """Every complete event after ``offset`` except metric points, read in bounded chunks.

    What a run reported about itself (result, error, digests, fingerprint) is found without
    holding its metric backlog in memory: metric lines are skipped by their prefix, unparsed, and a
    line over ``max_line_bytes`` is skipped as it is read (never joined), as :class:`EventReader` does.
    """
    partial = b""
    skipping = False
    path = os.path.abspath(path)
    try:
        with os.fdopen(runfiles.open_fd(path, os.path.dirname(path)), "rb") as f:
            f.seek(offset)
            while chunk := f.read(chunk_bytes):
                if skipping:
                    cut = chunk.find(b"\n")
                    if cut < 0:
                        continue
                    chunk, skipping = chunk[cut + 1:], False
                *lines, partial = (partial + chunk).split(b"\n")
                if len(partial) > max_line_bytes:
                    partial, skipping = b"", True
                for line in lines:
                    if len(line) <= max_line_bytes and not line.startswith(_METRIC_PREFIX) and line.strip():
                        yield _parse(line)
    except (FileNotFoundError, runfiles.UnsafeFileError):
        return  # no file, or one the run replaced (EventReader.refused says so)
