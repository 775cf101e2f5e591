"""Zero-code metric capture: TensorBoard event files and stdout/stderr lines of a run.

A run that logs only to TensorBoard (``SummaryWriter.add_scalar``, ``tf.summary.scalar``) or
prints ``step 100 | loss 2.31`` lines still reports metrics: the agent tails what the run
writes and appends metric events (``{"e": "m", ...}``, with ``"c"`` naming the source) to the
run's own event file, so they take the agent's normal path (bounded reads, batches, retries).

TensorBoard files are read here with a small TFRecord + protobuf reader (about 100 lines)
instead of the ``tensorboard`` package: the worker must run without TensorFlow and without
tensorboard's own dependencies (grpcio, werkzeug, protobuf, markdown…). Only scalar summaries
are read: ``simple_value`` (float32, what torch's SummaryWriter writes) and scalar tensors
(what TF2 ``tf.summary.scalar`` writes: float32; a float64 tensor keeps its double precision).
Record checksums are not verified: a torn last record is simply read again on the next pass.

Output lines are read by the spec's patterns and preset (:mod:`steady.worker.agent.presets`). A line
redrawn with ``\r`` (a progress bar) is one line: each step it shows counts once, with the last value
drawn for it (a bar redrawn five times at count 50 gives one point, its last). ANSI colours and
backspaces are removed before matching. Every captured event names its origin (``"o"``: the output's
line number or the event file's record number, ``"f"``: that event file) and, for printed values, the
significant digits printed (``"d"``), so a second value for one (key, step) can be told apart from the
same value printed rounded (:mod:`steady.worker.agent.conflicts`).
"""

from __future__ import annotations

import os
import re
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

from steady.worker.contract import runfiles
from steady.worker.contract.events import EventWriter, step_in_range
from steady.worker.contract.linear_re import compile_linear
from steady.worker.agent.presets import PatternReader, Reader, epoch_pattern, preset_reader, printed_precision
from steady.worker.agent.stepclock import StepClock
from steady.worker.contract.protocol import DEFAULT_CAPTURE_PATTERN as DEFAULT_PATTERN
from steady.worker.contract.protocol import DEFAULT_CAPTURE_PATTERNS as DEFAULT_PATTERNS
from steady.worker.contract.protocol import check_capture_pattern as check_pattern

__all__ = ["DEFAULT_PATTERN", "DEFAULT_PATTERNS", "Capture", "TFRecordTail", "check_pattern", "parse_event", "read_scalars"]

_KEY_BAD = re.compile(r"[^A-Za-z0-9_.:/\-]")
_TERMINAL_CODES = compile_linear(r"\x1b\[[0-9;?]*[A-Za-z]|[\x08\x1b]")  # colours, cursor moves, backspaces
MAX_LINE_BYTES = 64 * 1024  # a longer line (a progress bar without newlines) is cut
READ_BYTES = 1 << 20  # per file per pass
MAX_RECORD_BYTES = 64 << 20  # an event record larger than this means the file is not one
# A scalar event is a few hundred bytes; a larger record (an image, a histogram, a graph, or a 64 MiB
# packed-float "scalar") is stepped over by its length, never read: memory per pass stays one READ_BYTES.
MAX_SCALAR_RECORD_BYTES = 1 << 20
MAX_VARINT_BYTES = 10  # a protobuf varint is at most 10 bytes (64 bits); a longer one is not protobuf
PUMP_SECONDS = 0.5  # work per pass while the run goes (then the run's thread reads events and flushes)
CLOSE_SECONDS = 30.0  # and once it exited: a hostile output costs its own run this much, never the agent
SCAN_INTERVAL_S = 0.5
PUMP_READS = 16  # reads per file per pass while the run goes (the rest waits for the next pass)
CLOSE_READS = 256  # per file once the run exited: a file still growing cannot hold the agent


def metric_key(name: str) -> str:
    """A TensorBoard tag or group name as a metric key (characters the server refuses -> '_')."""
    return _KEY_BAD.sub("_", name.strip())[:200] or "_"


# --- TensorBoard: TFRecord framing + the few protobuf fields of Event/Summary/TensorProto ----


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """(value, next index) of the varint at ``i``: at most :data:`MAX_VARINT_BYTES` bytes (ValueError
    past that), so a hostile megabyte of continuation bits costs nothing (it was quadratic)."""
    shift = result = 0
    for _ in range(MAX_VARINT_BYTES):
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & 0xFFFF_FFFF_FFFF_FFFF, i  # as protobuf reads it: 64 bits
        shift += 7
    raise ValueError("varint longer than 10 bytes")


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a protobuf message: ints for varints, bytes for
    length-delimited fields, raw 8/4 bytes for fixed64/fixed32."""
    i, n = 0, len(buf)
    value: Any
    while i < n:
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i:i + size], i + size
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:  # groups (deprecated) do not occur in these messages
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield num, wire, value


_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_HALF = 1, 2, 3, 9, 19


def _tensor_scalar(buf: bytes) -> tuple[float, str] | None:
    """The one value of a scalar TensorProto, or None. A field with more than one element (a packed
    array) makes it no scalar: it is counted by its length, never unpacked."""
    dtype, content = 0, b""
    floats: list[bytes] = []
    doubles: list[bytes] = []
    ints: list[int] = []
    halves: list[int] = []
    for num, _, value in _fields(buf):
        if num == 1:
            dtype = value
        elif num == 2:  # shape: a scalar has no dims; reject anything with more than one element
            for dnum, _, dim in _fields(value):
                if dnum == 2 and any(n == 1 and v != 1 for n, _, v in _fields(dim)):
                    return None
        elif num == 4:
            content = value
        elif num == 5:
            floats.append(value)
        elif num == 6:
            doubles.append(value)
        elif num in (7, 10):
            ints.append(value)  # packed varints are rare for scalars; the common case is one value
        elif num == 13:
            halves.append(value)
        if len(floats) > 1 or len(doubles) > 1:
            return None
    if dtype == _DT_FLOAT:
        if floats:
            return (struct.unpack("<f", floats[0])[0], "float32") if len(floats[0]) == 4 else None
        return (struct.unpack("<f", content)[0], "float32") if len(content) == 4 else None
    if dtype == _DT_DOUBLE:
        if doubles:
            return (struct.unpack("<d", doubles[0])[0], "float64") if len(doubles[0]) == 8 else None
        return (struct.unpack("<d", content)[0], "float64") if len(content) == 8 else None
    if dtype == _DT_HALF:
        if content:
            return struct.unpack("<e", content[:2])[0], "float16"
        ok = halves and isinstance(halves[0], int)
        return (struct.unpack("<e", struct.pack("<H", halves[0] & 0xFFFF))[0], "float16") if ok else None
    if dtype in (_DT_INT32, _DT_INT64):
        if content:
            return float(struct.unpack("<i" if dtype == _DT_INT32 else "<q", content[:4 if dtype == _DT_INT32 else 8])[0]), "float64"
        return (float(ints[0]), "float64") if ints and isinstance(ints[0], int) else None
    return None


def parse_event(record: bytes) -> tuple[int, list[tuple[str, float, str]]]:
    """(step, [(tag, value, dtype)]) of one serialized ``tensorflow.Event``; scalars only."""
    _, step, out = parse_timed_event(record)
    return step, out


def parse_timed_event(record: bytes) -> tuple[float | None, int, list[tuple[str, float, str]]]:
    """(wall time, step, [(tag, value, dtype)]) of one serialized ``tensorflow.Event``: its
    ``wall_time`` (seconds since the epoch, when the run wrote it) too."""
    wall: float | None = None
    step, out = 0, []
    for num, wire, value in _fields(record):
        if num == 1 and wire == 1:
            wall = struct.unpack("<d", value)[0]
        elif num == 2:
            step = value - (1 << 64) if value >= 1 << 63 else value
        elif num == 5:  # summary
            for vnum, _, v in _fields(value):
                if vnum != 1:
                    continue
                tag, scalar = "", None
                for fnum, _, f in _fields(v):
                    if fnum == 1:
                        tag = f.decode("utf-8", "replace")
                    elif fnum == 2:  # simple_value (float)
                        scalar = (struct.unpack("<f", f)[0], "float32")
                    elif fnum == 8:  # tensor
                        scalar = _tensor_scalar(f)
                if tag and scalar is not None:
                    out.append((tag, scalar[0], scalar[1]))
    return wall, step, out


class TFRecordTail:
    """Complete records appended to one TFRecord file since the last call."""

    def __init__(self, path: str, root: str | None = None) -> None:
        self.path = os.path.abspath(path)
        self.root = root or os.path.dirname(self.path)  # the run directory: nothing outside is read
        self.offset = 0
        self.records = 0  # records read so far (the number of the last one)
        self.oversized = 0  # records over MAX_SCALAR_RECORD_BYTES, stepped over unread

    def read_new(self, max_bytes: int = READ_BYTES) -> list[bytes]:
        """Complete records after :attr:`offset`, from one bounded read; :class:`runfiles.UnsafeFileError`
        when the path is a symlink, FIFO or device (never opened, never read). A record over
        :data:`MAX_SCALAR_RECORD_BYTES` is stepped over by its length (counted in :attr:`oversized`):
        no read ever takes more than ``max_bytes``."""
        try:
            data = runfiles.read_at(self.path, self.root, self.offset, max_bytes)
        except runfiles.UnsafeFileError:
            raise
        except OSError:
            return []
        records: list[bytes] = []
        i = 0
        while len(data) - i >= 12:
            (length,) = struct.unpack_from("<Q", data, i)
            if length > MAX_RECORD_BYTES:  # not a TFRecord file (or a corrupt one): read no further
                self.offset = 1 << 62
                return records
            end = i + 12 + length + 4
            if length > MAX_SCALAR_RECORD_BYTES:  # not a scalar: skipped unread (read_at past the end gives b"")
                self.oversized += 1
                self.records += 1
                if end > len(data):
                    self.offset += end
                    return records
                i = end
                continue
            if end > len(data):
                break
            records.append(data[i + 12:i + 12 + length])
            i = end
        self.offset += i
        return records


def read_scalars(path: str) -> list[tuple[int, str, float, str]]:
    """Every scalar of one event file as (step, tag, value, dtype) (for tests and tools)."""
    out: list[tuple[int, str, float, str]] = []
    tail = TFRecordTail(path)
    while True:
        before = tail.offset
        records = tail.read_new()
        if tail.offset == before:
            break
        for record in records:
            step, values = parse_event(record)
            out.extend((step, tag, value, dtype) for tag, value, dtype in values)
    return out


# --- the capture a runner drives --------------------------------------------------------------


class Capture:
    """Tails a run's output file and its TensorBoard event files, appending metric events."""

    def __init__(self, *, events_path: str, output_path: str, roots: list[str], tensorboard: bool = True,
                 patterns: list[str] | None = None, preset: str | None = None) -> None:
        self.events_path = events_path
        self.output_path = output_path
        self.roots = roots
        self.tensorboard = tensorboard
        self.patterns: list[Reader] = [PatternReader(p) for p in (patterns or [])]
        if preset:
            self.patterns.append(preset_reader(preset))
        self._line_no = 1  # the output's line being read (1-based; a \r redraw stays on its line)
        self._pending: dict[int, tuple[int, dict[str, str]]] = {}  # reader -> the line's last reading so far
        self._pending_line: dict[int, str] = {}  # reader -> the line its pending reading came from
        self._top: dict[str, int] = {}  # key -> the last step read from the output
        # The first time a key's step went back on the output (a restart: e.g. a new epoch printed without its
        # number): protocol.MetricRestart fields; ``restarts`` counts the lines where one did
        self.restart: dict[str, Any] | None = None
        self.restarts = 0
        self._last_step: dict[str, int] = {}
        self._writer: EventWriter | None = None
        self._out_offset = 0
        self._partial = b""
        self._tails: dict[str, TFRecordTail] = {}
        self.last: dict[str, float] = {}  # last captured value of every key (final metrics)
        self.keys_by_source: dict[str, set[str]] = {"tensorboard": set(), "stdout": set()}
        self.sdk_keys: set[str] = set()  # keys the run logs through the SDK: those win
        self.skipped: dict[str, str] = {}  # path -> why it was not read (a symlink, FIFO, device…)
        self.bad_records = 0  # TensorBoard records that are no event (corrupt, or a varint over 10 bytes)
        self.bad_steps = 0  # readings whose step is outside int64 (skipped; the run's other points kept)
        self.unfinished = False  # the last pass ran out of time before the end of the run's files
        self._before = set(self._event_files()) if tensorboard else set()  # shipped with the code: not this run's
        # step times of a run that does not log them (steady.worker.agent.stepclock): when each step
        # line arrived (``arrival(end offset)``, the runner's output tee) and TensorBoard wall times
        self.arrival: Callable[[int], float | None] | None = None
        self.clocks: dict[str, StepClock] = {}
        self._timed_file: str | None = None  # the one TensorBoard file whose wall times are used
        self._at = 0  # the output's offset just after what was matched last (for ``arrival``)

    def notes(self) -> list[str]:
        """What this capture left out of the run's own files, one line each (the run's warnings)."""
        out = []
        oversized = sum(t.oversized for t in self._tails.values())
        if oversized:
            out.append(f"{oversized} TensorBoard record(s) over {MAX_SCALAR_RECORD_BYTES} bytes skipped unread "
                       "(no scalar is that large)")
        if self.bad_records:
            out.append(f"{self.bad_records} TensorBoard record(s) skipped: not a readable event")
        if self.bad_steps:
            out.append(f"{self.bad_steps} captured reading(s) skipped: step outside the 64-bit signed range")
        if self.unfinished:
            out.append(f"the run's output and event files were not read to their end within {CLOSE_SECONDS:g} s")
        if self.restart is not None:
            r = self.restart
            out.append(f"the step counter of {r['key']} went back at output line {r['line']} (step {r['step_before']}, "
                       f"then {r['step_after']}): a restart, e.g. a new epoch printed without its number; values at "
                       "steps already read are kept as first read and the later ones recorded as conflicts"
                       + (f"; a capture pattern naming the epoch keeps every value: {r['pattern']}" if r["pattern"]
                          else "; name the epoch in the capture pattern (a group 'epoch') to keep every value"))
        return out

    def _skip(self, exc: runfiles.UnsafeFileError) -> None:
        self.skipped.setdefault(exc.path, exc.reason)

    def _emit(self, source: str, step: int, values: dict[str, float], dtypes: dict[str, str],
              origin: dict[str, Any] | None = None, printed: dict[str, float] | None = None, *,
              final: bool = True) -> None:
        held: dict[str, float] = {}
        if self.sdk_keys:
            # a key the run logs itself through the SDK is the SDK's: its captured value is not sent, only
            # held beside the event so that the agent can record it when it differs from the SDK's
            held = {k: v for k, v in values.items() if k in self.sdk_keys}
            values = {k: v for k, v in values.items() if k not in self.sdk_keys}
            dtypes = {k: d for k, d in dtypes.items() if k in values}
            printed = {k: r for k, r in (printed or {}).items() if k in values}
        if not values and not held:
            return
        if not step_in_range(step):  # e.g. "step 18446744073709551616": this reading only is dropped
            self.bad_steps += 1
            return
        if self._writer is None:
            try:
                self._writer = EventWriter(self.events_path)
            except runfiles.UnsafeFileError as exc:  # the run replaced its event file: nothing is appended
                self._skip(exc)
                return
            except OSError:
                return
        event: dict[str, Any] = {"e": "m", "s": int(step), "v": values, "c": source}
        if held:
            event["h"] = held
        if dtypes:
            event["t"] = dtypes
        if origin:
            event.update(origin)
            if "d" in origin:
                event["d"] = {k: d for k, d in origin["d"].items() if k in values or k in held}
        if printed:
            event["r"] = printed
        self._writer.write(event)
        if not final:  # a derived value (a step time): neither a final metric nor a captured key
            return
        for key, value in values.items():  # the final value: the one at the highest step, first logged
            if step > self._last_step.get(key, step - 1):
                self._last_step[key] = step
                self.last[key] = value
        self.keys_by_source[source].update(values)

    def _time_step(self, source: str, step: int, at: float | None) -> None:
        """Date a reported step; emit the step time it closes as ``step_time:<source>``."""
        if at is None:
            return
        elapsed = self.clocks.setdefault(source, StepClock()).observe(step, at)
        if elapsed is not None:
            self._emit(source, step, {f"step_time:{source}": elapsed}, {}, final=False)

    def pump(self) -> None:
        """One pass while the run goes: at most :data:`PUMP_READS` reads of each file and about
        :data:`PUMP_SECONDS` of work (the rest on later passes)."""
        deadline = time.monotonic() + PUMP_SECONDS
        for _ in range(PUMP_READS if self.patterns else 0):
            if not self._pump_output() or time.monotonic() > deadline:
                break
        if self.tensorboard:  # a budget of its own: a flood of output does not starve the event files
            self._pump_tensorboard(PUMP_READS, time.monotonic() + PUMP_SECONDS)

    def close(self) -> None:
        """The last pass, once the run exited: what is left in its files, up to :data:`CLOSE_READS` reads
        each and :data:`CLOSE_SECONDS` in all (what is left past either is not read: :meth:`notes` says so)."""
        deadline = time.monotonic() + CLOSE_SECONDS
        for _ in range(CLOSE_READS if self.patterns else 0):
            if not self._pump_output():
                break
            if time.monotonic() > deadline:
                self.unfinished = True
                break
        if self.tensorboard:
            self._pump_tensorboard(CLOSE_READS, deadline)
            self.unfinished = self.unfinished or time.monotonic() > deadline
        if self.patterns:  # a last line without a newline
            if self._partial:
                self._at = self._out_offset
                self._match(self._partial)
            self._end_line()
            self._partial = b""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # stdout / stderr
    def _pump_output(self) -> int:
        if self.output_path in self.skipped:
            return 0
        try:
            chunk = runfiles.read_at(self.output_path, os.path.dirname(self.output_path), self._out_offset, READ_BYTES)
        except runfiles.UnsafeFileError as exc:
            self._skip(exc)
            return 0
        except OSError:
            return 0
        self._at = self._out_offset - len(self._partial)  # the offset where the data below starts
        self._out_offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        partial = lines.pop()
        for line in lines:
            for drawn in line.split(b"\r"):  # a bar's redraws, then the line's end
                self._at += len(drawn) + 1
                if drawn:
                    self._match(drawn[:MAX_LINE_BYTES])
            self._end_line()
        *redraws, partial = partial.split(b"\r")  # redraws of a line still being drawn
        for drawn in redraws:
            self._at += len(drawn) + 1
            if drawn:
                self._match(drawn[:MAX_LINE_BYTES])
        self._partial = partial[-MAX_LINE_BYTES:]
        return len(chunk)

    def _match(self, raw: bytes) -> None:
        """Read one drawn line; a reading waits until the line ends or a redraw shows another step."""
        line = raw.decode("utf-8", "replace")
        if "\x1b" in line or "\x08" in line:  # most lines have no escapes: no pass over them
            line = _TERMINAL_CODES.sub("", line)
        for i, reader in enumerate(self.patterns):
            for step, texts in reader.read(line):
                pending = self._pending.get(i)
                if pending is not None and pending[0] != step:
                    self._emit_reading(*pending, reader=i)
                self._pending[i] = (step, texts)
                self._pending_line[i] = line

    def _end_line(self) -> None:
        for i in sorted(self._pending):
            self._emit_reading(*self._pending[i], reader=i)
        self._pending.clear()
        self._line_no += 1

    def _went_back(self, step: int, keys, reader: int) -> None:
        """Note a step counter that goes back (a restart: its values at steps already read become conflicts)."""
        back = {k: self._top[k] for k in keys if step < self._top.get(k, step)}
        for k in keys:
            self._top[k] = step  # the last step read: the next restart is the next time it goes back
        if not back:
            return
        self.restarts += 1
        if self.restart is None:
            key = sorted(back)[0]
            found = self.patterns[reader]
            line = self._pending_line.get(reader, "")
            suggestion = epoch_pattern(found.pattern, line) if isinstance(found, PatternReader) else None
            self.restart = {"key": key, "line": self._line_no, "step_before": back[key], "step_after": step,
                            "pattern": suggestion}

    def _emit_reading(self, step: int, texts: dict[str, str], *, reader: int = 0) -> None:
        values, digits, printed = {}, {}, {}
        for name, text in texts.items():
            try:
                value = float(text)
            except ValueError:
                continue
            key = metric_key(name)
            values[key] = value
            digits[key], unit = printed_precision(text)
            if unit is not None:
                printed[key] = unit
        if values and step_in_range(step):
            self._went_back(step, values, reader)
        self._emit("stdout", step, values, {}, {"o": self._line_no, "d": digits}, printed)
        if self.arrival is not None and values:
            self._time_step("stdout", step, self.arrival(self._at))

    # TensorBoard
    def _root_of(self, path: str) -> str:
        return next((r for r in self.roots if os.path.commonpath([os.path.abspath(r), path]) == os.path.abspath(r)),
                    os.path.dirname(path))

    def _event_files(self) -> Iterator[str]:
        for root in self.roots:
            for folder, dirs, files in os.walk(root):
                dirs.sort()
                for name in sorted(files):
                    if "tfevents" in name:
                        yield os.path.abspath(os.path.join(folder, name))

    def _pump_tensorboard(self, reads: int, deadline: float = float("inf")) -> None:
        for path in self._event_files():
            if path not in self._tails and path not in self._before:
                self._tails[path] = TFRecordTail(path, self._root_of(path))
        for tail in self._tails.values():
            for _ in range(0 if tail.path in self.skipped else reads):
                if time.monotonic() > deadline:
                    return
                before = tail.offset
                try:
                    records = tail.read_new()
                except runfiles.UnsafeFileError as exc:
                    self._skip(exc)
                    break
                if tail.offset == before:  # nothing complete yet (records stepped over count as progress)
                    break
                for record in records:
                    tail.records += 1
                    try:
                        wall, step, scalars = parse_timed_event(record)
                    except (ValueError, IndexError, struct.error):
                        self.bad_records += 1
                        continue  # not an event (or a corrupt record): skipped
                    values = {metric_key(tag): v for tag, v, _ in scalars}
                    dtypes = {metric_key(tag): d for tag, _, d in scalars if d != "float64"}
                    where = os.path.relpath(tail.path, self.roots[0]) if self.roots else os.path.basename(tail.path)
                    self._emit("tensorboard", step, values, dtypes, {"o": tail.records, "f": where})
                    if values and (self._timed_file or tail.path) == tail.path:
                        self._timed_file = tail.path
                        self._time_step("tensorboard", step, wall)
