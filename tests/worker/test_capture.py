"""Zero-code capture: TensorBoard files written by the real libraries, and stdout patterns.

The event-file reader is checked against tensorboard's own loader (an independent reference)
on files written by torch's SummaryWriter (simple_value) and TF2's tf.summary (tensors).
"""

from __future__ import annotations

import glob
import os
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

from steady.worker.agent.capture import (
    DEFAULT_PATTERN,
    Capture,
    TFRecordTail,
    check_pattern,
    read_scalars,
)


def _reference(path: str) -> list[tuple[int, str, float]]:
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.util import tensor_util

    out = []
    for event in event_file_loader.LegacyEventFileLoader(path).Load():
        for v in event.summary.value:
            if v.HasField("simple_value"):
                out.append((event.step, v.tag, float(v.simple_value)))
            elif v.HasField("tensor"):
                out.append((event.step, v.tag, float(tensor_util.make_ndarray(v.tensor).item())))
    return out


def test_torch_summary_writer_scalars_read_exactly(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp_path / "runs" / "a"))
    rng = np.random.default_rng(0)
    values = rng.normal(size=50)
    for step, v in enumerate(values):
        w.add_scalar("Loss/train", v, step * 10)
    w.add_scalar("lr", 0.1, 3, new_style=True)  # a float tensor instead of simple_value
    w.close()
    (path,) = glob.glob(str(tmp_path / "runs" / "a" / "*tfevents*"))
    got = read_scalars(path)
    assert [(s, t, v) for s, t, v, _ in got] == _reference(path)
    assert [v for _, t, v, _ in got if t == "Loss/train"] == [float(np.float32(v)) for v in values]
    assert {d for *_, d in got} == {"float32"}


def test_tf_summary_scalars_and_double_tensors(tmp_path):
    tf = pytest.importorskip("tensorflow")
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        for step in range(5):
            tf.summary.scalar("acc", 1 / 3 + step, step=step)
        tf.summary.write("exact", tf.constant(1 / 3, tf.float64), step=7)
    writer.close()
    (path,) = glob.glob(str(tmp_path / "*tfevents*"))
    got = read_scalars(path)
    assert [(s, t, v) for s, t, v, _ in got] == _reference(path)
    assert (7, "exact", 1 / 3, "float64") in got  # double precision kept
    assert [d for _, t, _, d in got if t == "acc"] == ["float32"] * 5


def test_a_torn_record_is_read_once_complete(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp_path / "src"))
    for step in range(3):
        w.add_scalar("x", step / 7, step)
    w.close()
    (src,) = glob.glob(str(tmp_path / "src" / "*tfevents*"))
    data = Path(src).read_bytes()
    part = tmp_path / "part.tfevents"
    part.write_bytes(data[:-7])
    tail = TFRecordTail(str(part))
    first = tail.read_new()
    with open(part, "ab") as f:
        f.write(data[-7:])
    assert len(first) + len(tail.read_new()) == len(TFRecordTail(src).read_new())
    junk = tmp_path / "junk.tfevents"
    junk.write_bytes(b"\xff" * 64)  # a huge record length: not read, no error
    assert TFRecordTail(str(junk)).read_new() == [] and read_scalars(str(junk)) == []


@pytest.mark.parametrize("line, step, loss", [
    ("step 100 | loss 2.31", 100, 2.31),
    ("Step 100: loss=2.31", 100, 2.31),
    ("iter 100, loss: 2.31", 100, 2.31),
    ("Epoch 2 step 7/100 lr 0.1 loss 1.5e-3", 7, 1.5e-3),
    ("it 5 loss nan", 5, float("nan")),
])
def test_default_pattern(line, step, loss):
    m = re.search(DEFAULT_PATTERN, line)
    assert m and int(m["step"]) == step
    assert float(m["loss"]) == loss or (np.isnan(loss) and np.isnan(float(m["loss"])))


def test_default_pattern_ignores_other_lines():
    for line in ("loss 2.3", "steps: 4 done", "Starting training", "global step 3 accuracy 0.5"):
        assert re.search(DEFAULT_PATTERN, line) is None, line


def test_check_pattern_says_why():
    assert "not a valid regular expression" in check_pattern("(?P<step>\\d+")
    assert "named group 'step'" in check_pattern("(?P<loss>\\S+)")
    assert "besides 'step'" in check_pattern("(?P<step>\\d+)")
    assert check_pattern(r"epoch (?P<step>\d+) acc (?P<acc>\S+)") is None


def test_capture_appends_metric_events_incrementally(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    out = tmp_path / "output.log"
    events = tmp_path / "events.jsonl"
    cap = Capture(events_path=str(events), output_path=str(out), roots=[str(tmp_path)],
                  patterns=[DEFAULT_PATTERN, r"val (?P<step>\d+) acc=(?P<acc>\S+)"])
    with open(out, "w") as f:
        f.write("Starting\nstep 1 | loss 0.5\nval 1 acc=0.25\nstep 2 | lo")
    cap.pump()
    w = SummaryWriter(str(tmp_path / "deep" / "tb"))
    w.add_scalar("Loss/train", 0.75, 1)
    w.flush()
    cap.pump()
    with open(out, "a") as f:
        f.write("ss 0.125\r\n")
    cap.sdk_keys.add("acc")
    with open(out, "a") as f:
        f.write("val 2 acc=0.5")  # no newline: read at close
    w.close()
    cap.close()
    import json

    lines = [json.loads(line) for line in events.read_text().splitlines()]
    got = [(e["c"], e["s"], e["v"]) for e in lines]
    # once the SDK logs "acc", a captured "acc" is not sent, only held beside the event for the conflict check
    assert got == [("stdout", 1, {"loss": 0.5}), ("stdout", 1, {"acc": 0.25}),
                   ("tensorboard", 1, {"Loss/train": 0.75}), ("stdout", 2, {"loss": 0.125}), ("stdout", 2, {})]
    assert lines[-1]["h"] == {"acc": 0.5} and "h" not in lines[0]
    assert lines[2]["t"] == {"Loss/train": "float32"}
    assert cap.last == {"loss": 0.125, "acc": 0.25, "Loss/train": 0.75}


# TensorBoard's own record writer and protos, as torch's SummaryWriter writes through them (its files are read
# against tensorboard's loader in test_torch_summary_writer_scalars_read_exactly), without their import cost in
# the run: `torch.utils.tensorboard` imports torch and TensorFlow (about 5 CPU-s), this about 0.2.
WRITE_EVENTS = """
    import time
    from pathlib import Path

    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    class Writer:
        def __init__(self, logdir):
            Path(logdir).mkdir(parents=True, exist_ok=True)
            self.records = RecordWriter(open(Path(logdir, f"events.out.tfevents.{time.time():010.0f}.host"), "wb"))
            self.records.write(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())

        def add_scalar(self, tag, value, step):
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
            self.records.write(Event(wall_time=time.time(), step=step, summary=summary).SerializeToString())
            self.records.flush()

        def close(self):
            self.records.close()
"""

SCRIPT = WRITE_EVENTS + """
    w = Writer("tb/run1")
    for step in range(4):
        w.add_scalar("Loss/train", 1.0 / (step + 1), step)
        print(f"step {step} | loss {2.0 / (step + 1)}", flush=True)
    w.close()
"""


@pytest.mark.slow
def test_a_command_workload_is_captured_without_the_sdk(tmp_path):
    from steady.worker.agent.local import run_local

    code = tmp_path / "run" / "code"
    (code / "old").mkdir(parents=True)
    (code / "train.py").write_text(textwrap.dedent(SCRIPT))
    scope: dict = {}
    exec(textwrap.dedent(WRITE_EVENTS), scope)
    w = scope["Writer"](str(code / "old"))  # an event file shipped with the code is not this run's
    w.add_scalar("loss", 99.0, 0)
    w.close()
    spec = {"framework": "python", "seed": 1, "determinism": "seeded", "time_limit_s": 120,  # no framework imported
            "command": ["python", "train.py"]}
    r = run_local(spec, code_dir=str(code), work_dir=str(tmp_path / "run"))
    assert r.ok, r.stderr_tail
    assert r.series["loss"] == ([0, 1, 2, 3], [2.0, 1.0, 2 / 3, 0.5])
    assert r.series["Loss/train"] == ([0, 1, 2, 3], [float(np.float32(1 / (s + 1))) for s in range(4)])
    assert r.final_metrics["loss"] == 0.5
    off = run_local({**spec, "capture": {"tensorboard": False, "stdout": False}}, code_dir=str(code),
                    work_dir=str(tmp_path / "run"))
    assert off.ok and "loss" not in off.series and "Loss/train" not in off.series
    assert os.path.isdir(code / "tb")


def test_everything_left_is_read_at_the_end(tmp_path, monkeypatch):
    from steady.worker.agent import capture

    monkeypatch.setattr(capture, "READ_BYTES", 64)  # many reads per pass
    out = tmp_path / "output.log"
    out.write_text("".join(f"iter {i}, loss: {i / 8}\n" for i in range(200)))
    cap = Capture(events_path=str(tmp_path / "events.jsonl"), output_path=str(out), roots=[], tensorboard=False,
                  patterns=[DEFAULT_PATTERN])
    cap.pump()  # bounded reads while the run goes
    assert 0 < len((tmp_path / "events.jsonl").read_text().splitlines()) < 200
    cap.close()
    import json

    steps = [json.loads(line)["s"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert steps == list(range(200)) and cap.last == {"loss": 199 / 8}
