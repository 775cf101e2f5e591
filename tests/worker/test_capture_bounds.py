"""A run's output and files are data from an untrusted source: capture and the event reader do bounded
work on them (linear-time patterns, bounded lines, records and varints), and what they cannot read costs
the run a warning, never its valid points."""

from __future__ import annotations

import struct
import sys
import textwrap
import time

import pytest

from steady.worker.agent import capture as capture_mod
from steady.worker.agent.capture import DEFAULT_PATTERNS, MAX_SCALAR_RECORD_BYTES, READ_BYTES, Capture, check_pattern
from steady.worker.agent.capture import parse_event, read_scalars
from steady.worker.agent.local import run_local
from steady.worker.contract import runfiles
from steady.worker.contract.events import EventReader, control_events

CATASTROPHIC = r"(?P<step>\d+)(?P<loss>(a+)+)x"  # exponential in a backtracking engine on "1aaaa…a"
NESTED_END = r"(?P<step>\d+)(?P<loss>(a+)+)$"  # the same on "1aaaa…ab"
LINE = 64 * 1024


# --- a few protobuf bytes: an Event with a step and one simple_value ----------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, wire: int, payload: bytes) -> bytes:
    key = _varint(num << 3 | wire)
    return key + (_varint(len(payload)) + payload if wire == 2 else payload)


def _event(step: int, tag: str, value: float) -> bytes:
    value_msg = _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", value))
    return _field(2, 0, _varint(step)) + _field(5, 2, _field(1, 2, value_msg))


def _tensor_event(step: int, tag: str, floats: bytes) -> bytes:
    tensor = _field(1, 0, _varint(1)) + _field(5, 2, floats)  # dtype float, packed float_val
    value_msg = _field(1, 2, tag.encode()) + _field(8, 2, tensor)
    return _field(2, 0, _varint(step)) + _field(5, 2, _field(1, 2, value_msg))


def _record(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + b"\0" * 4 + data + b"\0" * 4  # checksums are not verified


# --- patterns ---------------------------------------------------------------------------------


def test_long_lines_and_a_catastrophic_pattern_take_milliseconds(tmp_path):
    out, events = tmp_path / "output.log", tmp_path / "events.jsonl"
    hostile = ["it 1 " * (LINE // 5), "step 1 " * (LINE // 7), "1" + "a" * (LINE - 1), "1" + "a" * (LINE - 2) + "b"]
    out.write_text("".join(line + "\n" for line in hostile * 6) + "step 3 loss 0.5\n")
    cap = Capture(events_path=str(events), output_path=str(out), roots=[str(tmp_path)], tensorboard=False,
                  patterns=[*DEFAULT_PATTERNS, CATASTROPHIC, NESTED_END])
    t0 = time.monotonic()
    cap.close()
    elapsed = time.monotonic() - t0
    assert elapsed < 2.0, f"24 hostile 64 KiB lines took {elapsed:.1f} s"
    assert cap.last == {"loss": 0.5}  # the honest line after them is read


def test_patterns_the_linear_engine_cannot_run_are_refused_with_the_reason():
    for pattern in (r"(?P<step>\d+) (?P<loss>\S+) \1", r"(?P<step>\d+)(?= ) (?P<loss>\S+)",
                    r"(?<!x)(?P<step>\d+) (?P<loss>\S+)", r"(?P<step>\d+) (?P<loss>\S+) (?P=loss)"):
        why = check_pattern(pattern)
        assert why is not None and "linear-time" in why and "lookaround" in why, (pattern, why)
    assert check_pattern(CATASTROPHIC) is None  # valid, and linear on RE2: accepted
    assert check_pattern(r"(?P<step>\d+) loss=(?P<loss>\S+)") is None  # named groups work


# --- the event file -----------------------------------------------------------------------------


def test_an_unterminated_event_line_is_skipped_holding_at_most_the_bound(tmp_path):
    path = tmp_path / "events.jsonl"
    bound = 4096
    with open(path, "wb") as f:
        f.write(b'{"e":"m","s":0,"v":{"loss":1.0}}\n' + b'{"e":"m","s":9,"v":{"loss":' + b"7" * 200_000)
    reader = EventReader(str(path), max_line_bytes=bound)
    got = []
    for _ in range(100):
        got += reader.read_new(8192)
        assert len(reader._partial) <= bound + 8192  # never the whole line
    assert [e["s"] for e in got] == [0] and reader.oversized == 1
    with open(path, "ab") as f:  # the line ends, and the run goes on writing
        f.write(b'}}\n{"e":"m","s":1,"v":{"loss":0.5}}\n{"e":"result","final_metrics":{}}\n')
    got = []
    while batch := reader.read_new(8192):
        got += batch
    assert [e.get("s") for e in got] == [1, None] and reader.oversized == 1
    # what the agent reads at the end (results behind a backlog) skips the long line the same way
    assert [e["e"] for e in control_events(str(path), max_line_bytes=bound, chunk_bytes=8192)] == ["result"]


def test_events_with_a_step_outside_int64_cost_the_run_a_warning_not_its_points(tmp_path):
    script = tmp_path / "hostile.py"
    script.write_text(textwrap.dedent("""
        import json, os
        with open(os.environ["STEADY_EVENTS_FILE"], "a") as f:
            for event in ({"e": "m", "s": 0, "v": {"loss": 1.0}}, {"e": "m", "s": 2 ** 64, "v": {"loss": 9.0}},
                          {"e": "m", "s": 1, "v": {"loss": 0.5, "acc": 10 ** 400}, "t": "x", "r": [1]}, {"e": "m", "s": "x", "v": {}},
                          {"e": "digest", "kind": "data_order", "value": "ab", "epoch": "no"}):
                f.write(json.dumps(event) + "\\n")
        print("step 18446744073709551616 acc 3.0", flush=True)
    """))
    spec = {"framework": "torch", "seed": 0, "determinism": "none", "time_limit_s": 60,
            "command": ["python", "-S", str(script)],
            "capture": {"tensorboard": False, "patterns": [r"step (?P<step>\d+) acc (?P<acc>\S+)"]}}
    r = run_local(spec, work_dir=str(tmp_path / "run"), device="cpu")
    assert r.ok, (r.error, r.stderr_tail)
    assert r.series["loss"] == ([0, 1], [1.0, 0.5])
    assert "acc" not in r.series
    assert "[steady] skipped 4 event(s) or value(s) of events.jsonl" in r.stderr_tail
    assert "[steady] 1 captured reading(s) skipped: step outside the 64-bit signed range" in r.stderr_tail


# --- TensorBoard records and varints ---------------------------------------------------------------


def test_an_oversized_record_is_stepped_over_unread(tmp_path, monkeypatch):
    path = tmp_path / "events.out.tfevents.1"
    with open(path, "wb") as f:
        f.write(_record(_event(1, "loss", 1.0)))
        big = 64 << 20  # a 64 MiB "scalar": written sparse (a hole), as cheap for the test as for the run
        f.write(struct.pack("<Q", big) + b"\0" * 4)
        f.seek(big + 4, 1)
        f.write(_record(_event(2, "loss", 0.5)))
        f.write(_record(_tensor_event(3, "loss", struct.pack("<200000f", *([0.25] * 200_000)))))  # packed: no scalar
        f.write(_record(_tensor_event(4, "loss", struct.pack("<f", 0.125))))  # packed, one value: a scalar
    reads = []
    real = runfiles.read_at

    def spy(p, root, offset, max_bytes):
        reads.append(max_bytes)
        return real(p, root, offset, max_bytes)

    monkeypatch.setattr(capture_mod.runfiles, "read_at", spy)
    assert read_scalars(str(path)) == [(1, "loss", 1.0, "float32"), (2, "loss", 0.5, "float32"),
                                       (4, "loss", 0.125, "float32")]
    assert max(reads) <= READ_BYTES  # the big record was never read


def test_a_long_varint_is_refused_at_ten_bytes_and_its_record_skipped(tmp_path):
    record = _field(2, 0, b"\xff" * 900_000 + b"\x01")  # a 900 kB varint step (was quadratic: minutes)
    t0 = time.monotonic()
    with pytest.raises(ValueError):
        parse_event(record)
    assert time.monotonic() - t0 < 0.5
    assert parse_event(_field(2, 0, _varint(2 ** 64 + 5)))[0] == 5  # 64 bits, as protobuf reads it
    assert len(record) < MAX_SCALAR_RECORD_BYTES
    root = tmp_path / "tb"
    root.mkdir()
    with open(root / "events.out.tfevents.1", "wb") as f:
        f.write(_record(_event(1, "loss", 1.0)) + _record(record) + _record(_event(2, "loss", 0.5)))
    cap = Capture(events_path=str(tmp_path / "events.jsonl"), output_path=str(tmp_path / "output.log"),
                  roots=[str(root)])
    cap._before = set()  # the file was there before the capture started; read it as the run's
    cap.close()
    assert cap.last == {"loss": 0.5} and cap.bad_records == 1
    assert "1 TensorBoard record(s) skipped: not a readable event" in cap.notes()


@pytest.mark.skipif(sys.platform != "linux", reason="sparse files")
def test_oversized_records_are_noted(tmp_path):
    root = tmp_path / "tb"
    root.mkdir()
    with open(root / "events.out.tfevents.1", "wb") as f:
        f.write(struct.pack("<Q", 2 << 20) + b"\0" * 4)
        f.seek((2 << 20) + 4, 1)
        f.write(_record(_event(7, "loss", 2.0)))
    cap = Capture(events_path=str(tmp_path / "events.jsonl"), output_path=str(tmp_path / "output.log"),
                  roots=[str(root)])
    cap._before = set()
    cap.close()
    assert cap.last == {"loss": 2.0}
    assert any("over 1048576 bytes skipped unread" in note for note in cap.notes())
