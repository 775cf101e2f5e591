"""Epoch-aware capture: a step counter that restarts every epoch is placed on one global step series, by a
capture pattern's ``epoch`` group and by the pytorch/examples presets (mnist, word_language_model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steady.worker.agent.capture import Capture
from steady.worker.agent.presets import EpochSteps
from steady.worker.contract.protocol import CaptureSpec, check_capture_pattern


def _captured(tmp_path: Path, output: str, **options) -> list[dict]:
    out, events = tmp_path / "output.log", tmp_path / "events.jsonl"
    out.write_text(output)
    cap = Capture(events_path=str(events), output_path=str(out), roots=[str(tmp_path)], tensorboard=False, **options)
    cap.pump()
    cap.close()
    return [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []


def _points(events: list[dict], key: str) -> list[tuple[int, float]]:
    return [(e["s"], e["v"][key]) for e in events if key in e.get("v", {})]


def _wlm(epochs: int = 3) -> tuple[str, list[tuple[int, int, float]]]:
    lines, printed = [], []
    loss = 7.0
    for epoch in range(1, epochs + 1):
        for batch in (10, 20, 29):
            loss -= 0.07
            lines.append(f"| epoch {epoch:3d} | {batch:5d}/{29:5d} batches | lr 20.00 | ms/batch {45.49:5.2f} | "
                         f"loss {loss:5.2f} | ppl {2.0:8.2f}")
            printed.append((epoch, batch, float(f"{loss:.2f}")))
        lines.append(f"| end of epoch {epoch:3d} | time: {1.0:5.2f}s | valid loss {loss:5.2f} | valid ppl {3.0:8.2f}")
    lines.append(f"| End of training | test loss {loss:5.2f} | test ppl {4.0:8.2f}")
    return "\n".join(lines) + "\n", printed


def test_a_pattern_naming_the_epoch_keeps_every_epochs_values(tmp_path):
    output, printed = _wlm()
    pattern = r"\|\s*epoch\s+(?P<epoch>\d+)\s*\|\s*(?P<step>\d+)/[^|]*batches.*\|\s*loss\s+(?P<loss>[-+.\deE]+)"
    got = _points(_captured(tmp_path, output, patterns=[pattern]), "loss")
    # epoch 1 as printed (10, 20, 29); each later epoch starts one past the top of the one before (30, 60)
    assert got == [(b + 30 * (e - 1), v) for e, b, v in printed]
    assert got[-1][1] == printed[-1][2]  # the run's last printed loss is its last point


def test_without_the_epoch_the_second_epoch_repeats_steps(tmp_path):
    """What the epoch group fixes: a step-only pattern gives epoch 2 the steps of epoch 1."""
    output, _ = _wlm(2)
    got = _points(_captured(tmp_path, output, patterns=[r"\|\s*(?P<step>\d+)/[^|]*batches.*\|\s*loss\s+(?P<loss>[-+.\d]+)"]),
                  "loss")
    steps = [s for s, _ in got]
    assert steps == [10, 20, 29, 10, 20, 29]


def test_word_language_model_preset(tmp_path):
    output, printed = _wlm()
    events = _captured(tmp_path, output, preset="word_language_model")
    assert _points(events, "loss") == [((e - 1) * 29 + b, v) for e, b, v in printed]
    assert [s for s, _ in _points(events, "lr")] == [(e - 1) * 29 + b for e, b, _ in printed]
    assert [s for s, _ in _points(events, "valid_loss")] == [1, 2, 3]
    assert _points(events, "test_ppl") == [(3, 4.0)]
    assert not any("ms" in k for e in events for k in e.get("v", {}))


def test_mnist_preset(tmp_path):
    lines, want = [], []
    for epoch in (1, 2, 3):
        for n in (0, 640, 1280):
            loss = 2.0 / (epoch * 10 + n / 640 + 1)
            lines.append(f"Train Epoch: {epoch} [{n}/60000 ({100.0 * n / 60000:.0f}%)]\tLoss: {loss:.6f}")
            want.append(((epoch - 1) * 60000 + n, float(f"{loss:.6f}")))
        lines += ["", f"Test set: Average loss: {0.1 / epoch:.4f}, Accuracy: {9800 + epoch}/10000 (98%)", ""]
    events = _captured(tmp_path, "\n".join(lines) + "\n", preset="mnist")
    assert _points(events, "loss") == want
    assert _points(events, "test_accuracy") == [(e, (9800 + e) / 10000) for e in (1, 2, 3)]
    assert _points(events, "test_loss") == [(e, float(f"{0.1 / e:.4f}")) for e in (1, 2, 3)]


def test_epoch_steps_orders_by_epoch_then_step():
    g = EpochSteps()
    seq = [g.global_step(e, s) for e, s in [(1, 0), (1, 5), (2, 0), (2, 5), (3, 1)]]
    assert seq == [0, 5, 6, 11, 13] and seq == sorted(seq)


def test_patterns_and_presets_are_checked():
    assert check_capture_pattern(r"(?P<epoch>\d+) (?P<step>\d+) (?P<loss>\S+)") is None
    assert "per metric" in check_capture_pattern(r"(?P<epoch>\d+) (?P<step>\d+)")
    assert CaptureSpec(preset="mnist").preset == "mnist"
    with pytest.raises(ValueError):
        CaptureSpec(preset="mnst")


def test_a_step_counter_that_goes_back_is_a_restart_with_a_pattern_that_keeps_every_value(tmp_path):
    """Without an epoch, epoch 2's batches repeat epoch 1's steps: the capture says at which output line the
    count went back, and offers the pattern with an epoch group, which keeps every value when used."""
    output, printed = _wlm(2)
    step_only = r"\|\s*(?P<step>\d+)/[^|]*batches.*\|\s*loss\s+(?P<loss>[-+.\d]+)"
    out, events = tmp_path / "output.log", tmp_path / "events.jsonl"
    out.write_text(output)
    cap = Capture(events_path=str(events), output_path=str(out), roots=[], tensorboard=False, patterns=[step_only])
    cap.pump()
    cap.close()
    restart = cap.restart
    assert restart is not None and cap.restarts == 1
    # line 4 is epoch 1's end line; epoch 2's first batch is output line 5
    assert {k: restart[k] for k in ("key", "line", "step_before", "step_after")} == {
        "key": "loss", "line": 5, "step_before": 29, "step_after": 10}
    assert output.splitlines()[restart["line"] - 1].startswith("| epoch   2 |    10/")
    assert any("went back at output line 5" in n and restart["pattern"] in n for n in cap.notes())
    (tmp_path / "again").mkdir()
    got = _points(_captured(tmp_path / "again", output, patterns=[restart["pattern"]]), "loss")
    assert [v for _, v in got] == [v for _, _, v in printed]
    steps = [s for s, _ in got]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)


def test_the_conflict_record_carries_the_restart_to_the_server_and_its_words():
    from steady.server.runs.conflicts import conflict_lines, merged
    from steady.worker.agent.conflicts import ConflictGuard
    from steady.worker.contract.protocol import MetricConflicts

    g = ConflictGuard()
    assert g.summary() is None
    g.restart, g.restarts = {"key": "loss", "line": 5, "step_before": 29, "step_after": 10, "pattern": None}, 1
    record = MetricConflicts.model_validate(g.summary()).model_dump()
    assert record["restart"]["line"] == 5 and record["count"] == 0
    kept = merged(None, record)
    assert merged(kept, {"count": 1, "first": []})["restart"]["line"] == 5
    (line,) = conflict_lines(kept)
    assert line.startswith("capture restart: the step counter of loss went back at output line 5 (step 29, then 10)")
    assert "name the epoch in the capture pattern" in line
