"""The agent opens files a run can replace without trusting them (steady.worker.contract.runfiles).

Real symlinks, a real FIFO and /dev/zero: a run that swaps its output for a link to a secret
must not get the secret into its record, and capture must come back promptly from files that
would block or never end, naming them as skipped.
"""

from __future__ import annotations

import json
import os
import struct
import threading

import pytest

from tests.conftest import wait_until
from steady.worker.contract import runfiles
from steady.worker.agent.capture import Capture
from steady.worker.contract.events import EventReader, control_events
from steady.worker.agent.runner import RunProcess

SECRET = "stdw_THE-AGENT-TOKEN-never-in-a-record"


def _record(step: int, tag: str, value: float) -> bytes:
    """One TFRecord holding a tensorflow.Event with one simple_value scalar (CRCs are not checked)."""
    name = tag.encode()
    value_msg = b"\x0a" + bytes([len(name)]) + name + b"\x15" + struct.pack("<f", value)
    summary = b"\x0a" + bytes([len(value_msg)]) + value_msg
    event = b"\x10" + bytes([step]) + b"\x2a" + bytes([len(summary)]) + summary
    return struct.pack("<Q", len(event)) + b"\0" * 4 + event + b"\0" * 4


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "outside" / "token"
    path.parent.mkdir()
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


def test_only_regular_files_inside_the_root_are_opened(tmp_path, secret):
    root = tmp_path / "run"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "ok.log").write_bytes(b"0123456789")
    assert runfiles.read_at(str(root / "sub" / "ok.log"), str(root), 2, 3) == b"234"
    assert runfiles.read_tail(str(root / "sub" / "ok.log"), str(root), 4) == b"6789"
    os.symlink(secret, root / "leaf.log")
    os.symlink(secret.parent, root / "linked")
    os.symlink("/dev/zero", root / "zero")
    os.mkfifo(root / "fifo")
    for path, why in [(root / "leaf.log", "symbolic link"), (root / "linked" / "token", "folder 'linked'"),
                      (root / "zero", "symbolic link"), (root / "fifo", "not a regular file"),
                      (root / ".." / "outside" / "token", "not a file inside")]:
        with pytest.raises(runfiles.UnsafeFileError, match=why):
            runfiles.read_at(str(path), str(root), 0, 100)
    assert runfiles.size(str(root / "leaf.log")) == 0 and runfiles.size(str(root / "sub" / "ok.log")) == 10


def test_the_agent_never_writes_through_a_planted_link(tmp_path, secret):
    root = tmp_path / "run"
    root.mkdir()
    os.symlink(secret, root / "spec.json")
    with pytest.raises(runfiles.UnsafeFileError):
        runfiles.write_new(str(root / "spec.json"), str(root), b"{}")
    assert secret.read_text() == SECRET + "\n"
    os.symlink(secret, root / "events.jsonl")  # capture appends metrics to the run's event file
    (root / "output.log").write_text("step 1 | loss 0.5\n")
    cap = Capture(events_path=str(root / "events.jsonl"), output_path=str(root / "output.log"), roots=[str(root)],
                  tensorboard=False, patterns=[r"step (?P<step>\d+) \| loss (?P<loss>\S+)"])
    cap.close()
    assert secret.read_text() == SECRET + "\n"
    assert "symbolic link" in cap.skipped[str(root / "events.jsonl")]
    reader = EventReader(str(root / "events.jsonl"))
    assert reader.read_new() == [] and reader.refused and reader.unread_bytes() == 0
    assert list(control_events(str(root / "events.jsonl"))) == []


def test_capture_skips_dev_zero_and_fifo_event_files_promptly(tmp_path):
    root = tmp_path / "run"
    (root / "tb").mkdir(parents=True)
    cap = Capture(events_path=str(root / "events.jsonl"), output_path=str(root / "output.log"), roots=[str(root)])
    os.symlink("/dev/zero", root / "tb" / "x.tfevents.zero")
    os.mkfifo(root / "tb" / "y.tfevents.fifo")
    (root / "tb" / "z.tfevents.ok").write_bytes(_record(3, "loss", 0.5))
    done = threading.Event()

    def drive() -> None:
        cap.pump()
        cap.close()
        done.set()

    threading.Thread(target=drive, daemon=True).start()
    wait_until(done.is_set, timeout=60, what="capture to return from /dev/zero and a FIFO")
    assert set(cap.skipped) == {str(root / "tb" / "x.tfevents.zero"), str(root / "tb" / "y.tfevents.fifo")}
    assert "not a regular file" in cap.skipped[str(root / "tb" / "y.tfevents.fifo")]
    got = [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()]
    assert [(e["s"], e["v"]) for e in got] == [(3, {"loss": 0.5})]


LINKER = """
import os, sys
run_dir = sys.argv[1]
print("training output before the swap", flush=True)
os.remove(os.path.join(run_dir, "output.log"))
os.symlink(sys.argv[2], os.path.join(run_dir, "output.log"))
"""


def test_a_run_that_links_its_output_to_a_secret_gets_a_warning_not_the_secret(tmp_path, secret):
    script = tmp_path / "linker.py"
    script.write_text(LINKER)
    spec = {"framework": "python", "seed": 0, "repeat": 0, "determinism": "none", "time_limit_s": 120,
            "command": ["python", str(script), "{run_dir}", str(secret)]}  # the script imports no framework
    proc = RunProcess(spec, run_dir=str(tmp_path / "run"))
    proc.start()
    assert proc.wait(120) is not None
    outcome = proc.outcome()
    assert outcome.ok, outcome.error
    assert SECRET not in outcome.stderr_tail
    assert outcome.stderr_tail.endswith("[steady] skipped output.log: a symbolic link or not a regular file; "
                                        "the worker reads only regular files inside the run directory")
    assert SECRET not in json.dumps(proc.collected.__dict__, default=str)
