"""One value per (run, key, step): the first logged is kept, a different second one is recorded.

The script below is of a kind often published: it prints a running training loss every 10 steps and, every
500th step, an evaluation line that repeats the training key (``step N train loss: Y test loss: Z``). Both
lines match the default capture; before, the evaluation's Y silently replaced X at those steps.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import textwrap

import pytest

from steady.worker.agent.capture import DEFAULT_PATTERNS, Capture
from steady.worker.agent.conflicts import ConflictGuard, same_value
from steady.worker.contract.events import EventReader
from steady.worker.contract.protocol import MetricConflicts

EVAL_SCRIPT = textwrap.dedent("""
    import random

    random.seed(1)
    w, lr = 3.0, 0.05
    running = []
    for step in range(1, 1001):
        x = random.uniform(-1, 1)
        y = 0.5 * x + random.gauss(0, 0.3)
        w -= lr * 2 * (w * x - y) * x
        running.append((w * x - y) ** 2)
        if step % 10 == 0:
            print(f"step {step} | loss {sum(running) / len(running):.4f}", flush=True)
            running = []
        if step % 500 == 0:
            xs = [i / 50 - 1 for i in range(101)]
            full = sum((w * v - 0.5 * v) ** 2 for v in xs) / len(xs)
            print(f"step {step} train loss: {full:.4f} test loss: {full * 1.1:.4f}", flush=True)
""")


def _guarded(tmp_path, output: str) -> tuple[dict[int, float], ConflictGuard]:
    """What the agent sends for ``loss`` when a run prints ``output``, and its guard."""
    out, events = tmp_path / "output.log", tmp_path / "events.jsonl"
    out.write_text(output)
    cap = Capture(events_path=str(events), output_path=str(out), roots=[str(tmp_path)], tensorboard=False,
                  patterns=list(DEFAULT_PATTERNS))
    cap.close()
    guard, sent = ConflictGuard(), {}
    for event in EventReader(str(events)).read_new():
        for key, value in guard.admit(event).items():
            assert (event["s"], key) not in sent  # one value per (key, step) goes to the server
            sent[event["s"], key] = value
    return {s: v for (s, k), v in sent.items() if k == "loss"}, guard


def test_an_evaluation_line_repeating_the_training_key_is_recorded_not_kept(tmp_path):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(EVAL_SCRIPT, "train.py", "exec"), {"__name__": "__main__"})
    output = buf.getvalue()
    lines = output.splitlines()
    loss, guard = _guarded(tmp_path, output)
    assert sorted(loss) == list(range(10, 1001, 10))
    conflicts = MetricConflicts.model_validate(guard.summary())
    assert conflicts.count == 2 and [c.step for c in conflicts.first] == [500, 1000]
    for c in conflicts.first:
        train = next(i for i, line in enumerate(lines, 1) if line.startswith(f"step {c.step} |"))
        evaluation = next(i for i, line in enumerate(lines, 1) if line.startswith(f"step {c.step} train"))
        assert c.key == "loss" and loss[c.step] == c.kept.value  # the first value, X, is what the server gets
        assert c.kept.value == float(lines[train - 1].split()[-1]) and c.kept.source == f"stdout line {train}"
        assert c.dropped.value == float(lines[evaluation - 1].split()[4])
        assert c.dropped.source == f"stdout line {evaluation}" and c.dropped.value != c.kept.value


def test_identical_duplicates_and_the_same_value_printed_rounded_stay_silent():
    guard = ConflictGuard()
    assert guard.admit({"e": "m", "s": 1, "v": {"loss": 0.29540001}, "c": "tensorboard", "o": 3, "f": "tb/e"}) \
        == {"loss": 0.29540001}
    assert guard.admit({"e": "m", "s": 1, "v": {"loss": 0.2954}, "c": "stdout", "o": 7, "d": {"loss": 4}}) == {}
    assert math.isnan(guard.admit({"e": "m", "s": 2, "v": {"loss": math.nan}})["loss"])
    assert guard.admit({"e": "m", "s": 2, "v": {"loss": math.nan}}) == {}  # NaN again: the same value
    assert guard.admit({"e": "m", "s": 1, "v": {"loss": 0.29540001}}) == {}
    assert guard.summary() is None
    # printed at 4 digits, 0.2955 is another value than 0.29540001
    assert guard.admit({"e": "m", "s": 1, "v": {"loss": 0.2955}, "c": "stdout", "o": 9, "d": {"loss": 4}}) == {}
    (c,) = guard.summary()["first"]
    assert c["kept"] == {"value": 0.29540001, "source": "tensorboard tb/e record 3"}
    assert c["dropped"] == {"value": 0.2955, "source": "stdout line 9"}


def test_sdk_values_logged_twice_and_late_steps(tmp_path):
    guard = ConflictGuard()
    for step in (5, 6, 7):
        guard.admit({"e": "m", "s": step, "v": {"acc": step / 10}})
    assert guard.admit({"e": "m", "s": 3, "v": {"acc": 0.3}}) == {"acc": 0.3}  # a late step is new, not a conflict
    assert guard.admit({"e": "m", "s": 6, "v": {"acc": 0.61}}) == {}  # a resumed loop re-logs step 6 differently
    (c,) = guard.summary()["first"]
    assert c["kept"] == {"value": 0.6, "source": "sdk call 2"} and c["dropped"]["source"] == "sdk call 5"


def test_conflicts_are_bounded_first_kept_then_counted():
    guard = ConflictGuard(keep=3)
    for step in range(10):
        guard.admit({"e": "m", "s": step, "v": {"loss": 1.0}})
        guard.admit({"e": "m", "s": step, "v": {"loss": 2.0}})
    summary = guard.summary()
    assert summary["count"] == 10 and [c["step"] for c in summary["first"]] == [0, 1, 2]


def test_past_the_tracking_bound_points_go_on_unchecked():
    guard = ConflictGuard(max_points=2)
    for step in range(4):
        assert guard.admit({"e": "m", "s": step, "v": {"loss": 1.0}}) == {"loss": 1.0}
    assert guard.admit({"e": "m", "s": 0, "v": {"loss": 9.0}}) == {}  # tracked: still checked
    assert guard.admit({"e": "m", "s": 3, "v": {"loss": 9.0}}) == {"loss": 9.0}  # untracked: the server keeps the first


@pytest.mark.parametrize("a, b, da, db, same", [
    (0.2954, 0.29540001, 4, 0, True), (2.31, 2.295, 4, 4, False), (0.5, 0.5, 0, 0, True),
    (1.0, 1.0000000000000002, 0, 0, False), (math.inf, math.inf, 0, 0, True), (math.inf, 1e308, 3, 0, False),
    (2.31, 2.3141, 3, 0, True), (-0.0, 0.0, 0, 0, True),
])
def test_same_value(a, b, da, db, same):
    assert same_value(a, b, da, db) is same and same_value(b, a, db, da) is same


def test_events_name_their_line(tmp_path):
    out = tmp_path / "output.log"
    out.write_text("hello\nstep 3 | loss 0.50\n")
    cap = Capture(events_path=str(tmp_path / "e.jsonl"), output_path=str(out), roots=[str(tmp_path)],
                  tensorboard=False, patterns=list(DEFAULT_PATTERNS))
    cap.close()
    (event,) = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert event["o"] == 2 and event["d"] == {"loss": 2}


def test_a_conflict_always_fits_the_result_message():
    """A deep event file's path or a key the server would refuse must not make the run's report invalid."""
    guard = ConflictGuard()
    deep = "/".join(["d" * 50] * 10) + "/events.out.tfevents.1"
    guard.admit({"e": "m", "s": 1, "v": {"bad key!": 1.0}, "c": "tensorboard", "o": 1, "f": deep})
    guard.admit({"e": "m", "s": 1, "v": {"bad key!": 2.0}, "c": "tensorboard", "o": 2, "f": deep})
    (c,) = MetricConflicts.model_validate(guard.summary()).first
    assert c.key == "bad key!" and c.kept.source.endswith("events.out.tfevents.1 record 1")


@pytest.mark.parametrize("sdk_first", [True, False])
def test_a_captured_value_of_a_key_the_sdk_logs_is_held_and_recorded_when_it_differs(sdk_first):
    """The SDK's value wins (it is sent, the captured one never is), and a captured value that differs from
    it at its step is a recorded conflict, whichever arrived first; one equal at its printed digits is not."""
    guard = ConflictGuard()
    sdk = [{"e": "m", "s": s, "v": {"loss": v}} for s, v in ((1, 0.5), (2, 0.29540001), (3, 0.75))]
    held = [{"e": "m", "s": s, "v": {}, "h": {"loss": v}, "d": {"loss": 4}, "c": "stdout", "o": line}
            for s, v, line in ((1, 0.6125, 11), (2, 0.2954, 12))]
    sent = []
    for event in (sdk + held if sdk_first else held + sdk):
        sent.append(guard.admit(event))
    assert [v for v in sent if v] == [{"loss": 0.5}, {"loss": 0.29540001}, {"loss": 0.75}]
    summary = guard.summary()
    assert summary is not None and summary["count"] == 1  # step 2 agrees at the 4 digits printed
    (conflict,) = summary["first"]
    assert conflict["key"] == "loss" and conflict["step"] == 1
    assert conflict["kept"]["value"] == 0.5 and conflict["kept"]["source"].startswith("sdk call")
    assert conflict["dropped"] == {"value": 0.6125, "source": "stdout line 11"}


def test_a_run_that_logs_with_the_sdk_and_prints_another_value_gets_the_conflict_recorded(tmp_path):
    """A real run (pure Python, no framework): the SDK logs the loss and a print shows it again, once with
    another value. The SDK's values are the series; the printed one that differs is in the run's conflicts."""
    from steady.worker.agent.local import run_local
    from tests.worker.test_code_runner import unpacked_code

    script = textwrap.dedent("""
        import time
        from steady import sdk

        for step in range(5):
            loss = 1.0 / (step + 1)
            sdk.log(step=step, loss=loss)
            time.sleep(0.05)  # the SDK's event and the printed line may reach the agent in either order
            shown = loss * 2 if step == 3 else loss
            print(f"step {step} | loss {shown:.4f}", flush=True)
    """)
    code = unpacked_code({"exp/train.py": script}, tmp_path / "code")
    r = run_local({"framework": "python", "seed": 0, "repeat": 0, "determinism": "seeded", "threads": 1,
                   "time_limit_s": 60, "code_workdir": "exp", "command": ["python", "train.py"]},
                  code_dir=code, work_dir=str(tmp_path / "run"), device="cpu")
    assert r.ok, (r.error, r.stderr_tail)
    assert r.series["loss"] == ([0, 1, 2, 3, 4], [1.0 / (s + 1) for s in range(5)])
    conflicts = MetricConflicts.model_validate(r.conflicts)
    assert conflicts.count == 1, r.conflicts
    (c,) = conflicts.first
    assert (c.key, c.step, c.kept.value, c.dropped.value) == ("loss", 3, 0.25, 0.5)
    assert c.kept.source.startswith("sdk call") and c.dropped.source == "stdout line 4"
