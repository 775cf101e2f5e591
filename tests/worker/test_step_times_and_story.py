"""The pieces of a run's story and of its derived step times, in process: the output tee dates what a run
prints, the capture turns dated step lines and TensorBoard wall times into ``step_time:<source>``, the crash
line is found in a traceback, and the output tail is bounded in lines and shown without terminal escapes."""

from __future__ import annotations

import json
import os
import struct
import threading
import time

import pytest

from steady.server.kit.terminal import printable_output
from steady.worker.agent.capture import DEFAULT_PATTERN, Capture
from steady.worker.agent.runner import last_lines
from steady.worker.agent.stepclock import StepClock
from steady.worker.agent.tee import OutputTee
from steady.worker.contract.crashline import crash_line


def _events(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_step_clock_divides_time_over_the_steps_between_reports():
    clock = StepClock()
    assert clock.observe(0, 10.0) is None  # the first report starts the clock
    assert clock.observe(10, 11.0) == pytest.approx(0.1)  # printed every 10th step: the mean over 10
    assert clock.observe(10, 11.5) is None  # an evaluation line at the same step
    assert clock.observe(20, 11.5 + 1.0) == pytest.approx(0.15)  # the evaluation's time is in the next steps
    assert clock.observe(21, 12.5) is None  # arrived with the last one: timed with the next later report
    assert clock.observe(22, 12.7) == pytest.approx(0.1)
    assert clock.observe(0, 20.0) is None and clock.observe(1, 20.5) is None  # a counter that starts over:
    assert clock.observe(30, 23.4) == pytest.approx(0.1)  # only steps never timed get a time


def test_step_lines_are_timed_by_their_arrival_on_the_pipe(tmp_path):
    out = tmp_path / "output.log"
    read_fd, write_fd = os.pipe()
    tee = OutputTee(read_fd, os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    tee.start()
    cap = Capture(events_path=str(tmp_path / "events.jsonl"), output_path=str(out), roots=[], tensorboard=False,
                  patterns=[DEFAULT_PATTERN])
    cap.arrival = tee.arrival

    def run() -> None:  # a script's prints: two steps apart after 0.2 s, then one eval line and a step
        for text, pause in ((b"step 0 loss 1.0\n", 0.0), (b"step 2 loss 0.5\n", 0.2),
                            (b"step 2 eval loss 0.7\n", 0.0), (b"step 3 loss 0.25\n", 0.3)):
            time.sleep(pause)
            os.write(write_fd, text)
        os.close(write_fd)

    writer = threading.Thread(target=run)
    writer.start()
    cap.pump()  # while the run goes, then once it ended
    writer.join()
    tee.close()
    cap.close()
    times = {e["s"]: e["v"]["step_time:stdout"] for e in _events(tmp_path / "events.jsonl") if e["c"] == "stdout"
             and "step_time:stdout" in e["v"]}
    assert sorted(times) == [2, 3]
    assert 0.05 <= times[2] <= 0.4, times  # 0.2 s over 2 steps, give or take the scheduler
    assert 0.15 <= times[3] <= 0.8, times
    assert "step_time:stdout" not in cap.last  # not a final metric
    assert out.read_bytes().count(b"\n") == 4


def _record(data: bytes) -> bytes:
    """A TFRecord (the capture does not check its CRCs, written as zeros here)."""
    return struct.pack("<Q", len(data)) + b"\0" * 4 + data + b"\0" * 4


def _event(wall: float, step: int, tag: str, value: float) -> bytes:
    """A ``tensorflow.Event`` (event.proto: wall_time = 1, step = 2, summary = 5) with one scalar."""
    name = tag.encode()
    scalar = b"\x0a" + bytes([len(name)]) + name + b"\x15" + struct.pack("<f", value)  # Value: tag, simple_value
    summary = b"\x0a" + bytes([len(scalar)]) + scalar
    return b"\x09" + struct.pack("<d", wall) + b"\x10" + bytes([step]) + b"\x2a" + bytes([len(summary)]) + summary


def test_tensorboard_wall_times_give_step_times(tmp_path):
    cap = Capture(events_path=str(tmp_path / "events.jsonl"), output_path=str(tmp_path / "output.log"),
                  roots=[str(tmp_path)], patterns=[])
    (tmp_path / "tb").mkdir()
    with open(tmp_path / "tb" / "events.out.tfevents.1.host", "wb") as f:
        for step, wall in ((0, 1000.0), (1, 1000.25), (3, 1001.25)):
            f.write(_record(_event(wall, step, "Loss/train", 1.0 / (step + 1))))
            f.write(_record(_event(wall + 0.01, step, "lr", 0.1)))  # a second tag at the same step
    cap.close()
    times = [(e["s"], e["v"]) for e in _events(tmp_path / "events.jsonl") if "step_time:tensorboard" in e["v"]]
    assert times == [(1, {"step_time:tensorboard": 0.25}), (3, {"step_time:tensorboard": 0.5})]


def test_the_crash_line_is_the_last_tracebacks_exception():
    tail = ("step 2 loss 0.5\nTraceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
            "    raise ValueError('inner')\nValueError: inner\n\nDuring handling of the above exception, another "
            "exception occurred:\n\nTraceback (most recent call last):\n  File \"train.py\", line 11, in <module>\n"
            "    raise RuntimeError(f'loss became NaN at step {step}')\n    ^^^^^^^^^^^^^^^^^^\n"
            "RuntimeError: loss became NaN at step 3\n")
    assert crash_line(tail) == "RuntimeError: loss became NaN at step 3"
    assert crash_line("Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyboardInterrupt\n") == \
        "KeyboardInterrupt"
    assert crash_line("torch.cuda.OutOfMemoryError: CUDA out of memory") is None  # no traceback: no guess
    assert crash_line("Traceback (most recent call last):\n  File \"x.py\", line 1\n") is None  # cut off


def test_the_tail_is_bounded_in_lines_and_shown_without_escapes():
    text = "".join(f"line {i}\n" for i in range(500))
    assert last_lines(text, 200) == "".join(f"line {i}\n" for i in range(300, 500))
    assert last_lines("a\nb", 5) == "a\nb"
    shown = printable_output("\x1b[1;31mred\x1b[0m \x1b]0;title\x07ok\n 10%|#  \r 90%|#### \r100%|#####|\nend\x07\n")
    assert shown == "red ok\n100%|#####|\nend\n"
