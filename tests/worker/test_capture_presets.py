"""Capture presets and the default capture on output the real libraries print.

Keras' ``fit`` (verbose=2 epoch lines and verbose=1 progress bars redrawn with ``\\r``) and tqdm bars are
produced here by the libraries themselves, in process, and read back through :class:`Capture` as a run's
output file; what is captured is checked against the library's own record (Keras' ``History``) or the
values the loop set. transformers and Lightning are not installed: their lines are printed the way their
code prints them (the Trainer's ``ProgressCallback.on_log`` writes ``str(logs)`` with the epoch rounded to
2 digits; Lightning's bar is a tqdm bar with ``Epoch N`` as description and its metrics as postfix).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
from pathlib import Path

import pytest

from steady.worker.agent.capture import DEFAULT_PATTERNS, Capture
from steady.worker.agent.conflicts import same_value
from steady.worker.agent.presets import significant_digits


def _captured(tmp_path: Path, output: str, **options) -> list[dict]:
    """The metric events a run printing ``output`` gets, read in small pieces as a run writes."""
    out, events = tmp_path / "output.log", tmp_path / "events.jsonl"
    out.write_text("")
    cap = Capture(events_path=str(events), output_path=str(out), roots=[str(tmp_path)], tensorboard=False, **options)
    for i in range(0, len(output), 97):  # a bar redrawn across reads stays one line
        with open(out, "a") as f:
            f.write(output[i:i + 97])
        cap.pump()
    cap.close()
    return [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []


def _series(events: list[dict], key: str) -> dict[int, float]:
    return {e["s"]: e["v"][key] for e in events if key in e["v"]}


@functools.cache
def _keras_output(verbose: int):
    keras = pytest.importorskip("keras")
    import numpy as np

    x = np.random.default_rng(0).random((8, 3)).astype("float32")
    y = (x.sum(1) > 1.5).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=["accuracy"])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        history = model.fit(x, y, epochs=2, batch_size=4, verbose=verbose, validation_data=(x, y))
    return buf.getvalue(), history.history


@pytest.mark.parametrize("verbose", [2, 1])
def test_keras_fit_lines_give_one_point_per_epoch(tmp_path, verbose):
    output, history = _keras_output(verbose)
    if verbose == 1:
        assert "\r" in output  # the progress bar is redrawn: only each epoch's last drawing counts
    events = _captured(tmp_path, output, preset="keras")
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        got = _series(events, key)
        assert sorted(got) == [1, 2], (key, output)
        for epoch, want in enumerate(history[key], start=1):
            assert same_value(want, got[epoch], 0, 4), (key, epoch, want, got[epoch])  # Keras prints 4 decimals
    assert all(e["c"] == "stdout" and e["o"] > 0 for e in events)


def test_keras_preset_is_not_the_default(tmp_path):
    output, _ = _keras_output(2)
    assert _captured(tmp_path, output, patterns=list(DEFAULT_PATTERNS)) == []


def _tqdm_output(losses: list[float], **bar) -> str:
    tqdm = pytest.importorskip("tqdm").tqdm
    buf = io.StringIO()
    with tqdm(range(len(losses)), file=buf, mininterval=0, miniters=1, ascii=True, **bar) as progress:
        for i in progress:
            progress.set_postfix(loss=losses[i], acc=1 - losses[i] / 4)
    return buf.getvalue()


LOSSES = [2.3141, 1.87654, 1.5, 0.9876, 0.61234, 0.0004321]


def test_the_default_capture_takes_a_tqdm_postfix_once_per_step(tmp_path):
    output = _tqdm_output(LOSSES)
    # every iteration draws its count twice (tqdm's own refresh with the previous postfix, then set_postfix)
    assert output.count("\r") > 2 * len(LOSSES)
    events = _captured(tmp_path, output, patterns=list(DEFAULT_PATTERNS))
    got = _series(events, "loss")
    for i, loss in enumerate(LOSSES):
        assert same_value(loss, got[i], 0, 3), (i, loss, got[i])  # tqdm prints 3 significant digits
    assert sorted(got) == list(range(len(LOSSES) + 1))  # the bar's close draws the last count once more
    assert got[len(LOSSES)] == got[len(LOSSES) - 1]
    steps = [e["s"] for e in events]
    assert steps == sorted(set(steps))  # each step once: the last drawing of it
    assert all("acc" not in e["v"] for e in events)  # the default takes loss only; the tqdm preset takes all


@pytest.mark.parametrize("line, step", [
    (" 50%|#####     | 50/100 [00:01<00:01, 45.2it/s, loss=2.31]", 50),
    ("50it [00:01, 45.2it/s, loss=2.31]", 50),
    ("train: 100%|##########| 7/7 [1:02:03<00:00,  1.25s/it, lr=0.1, loss=2.31]", 7),
    ("2026-12-01 12:00:00,123 [INFO] loss=2.31", None),  # a logging format's bracket is not a bar
    ("2026/12/01 [INFO] loss=2.31", None),
])
def test_the_default_tqdm_pattern(tmp_path, line, step):
    events = _captured(tmp_path, line + "\n", patterns=list(DEFAULT_PATTERNS))
    assert [(e["s"], e["v"]) for e in events] == ([(step, {"loss": 2.31})] if step is not None else [])


def test_tqdm_preset_takes_every_postfix_number(tmp_path):
    got = _captured(tmp_path, _tqdm_output(LOSSES, desc="train"), preset="tqdm")
    acc = _series(got, "acc")
    assert all(same_value(1 - LOSSES[i] / 4, acc[i], 0, 3) for i in range(len(LOSSES)))


def test_lightning_bar_gives_one_point_per_epoch(tmp_path):
    tqdm = pytest.importorskip("tqdm").tqdm
    buf = io.StringIO()
    losses = {0: [0.71, 0.69, 0.6931], 1: [0.65, 0.62, 0.6012]}
    for epoch, values in losses.items():  # Lightning: one bar per epoch, "Epoch N" as its description
        with tqdm(total=len(values), desc=f"Epoch {epoch}", file=buf, mininterval=0, ascii=True) as bar:
            for v in values:
                bar.update(1)
                bar.set_postfix({"v_num": 0, "train_loss": f"{v:.3f}"})
    events = _captured(tmp_path, buf.getvalue(), preset="lightning")
    assert _series(events, "train_loss") == {0: 0.693, 1: 0.601}
    assert all("v_num" not in e["v"] for e in events)


def test_hf_trainer_dict_lines(tmp_path):
    logs = [{"loss": 2.3141, "grad_norm": 1.25, "learning_rate": 5e-05, "epoch": 0.5},
            {"eval_loss": 2.2, "eval_runtime": 0.31, "epoch": 1.0},
            {"loss": 1.9, "grad_norm": 0.75, "learning_rate": 2.5e-05, "epoch": 1.5}]
    lines = []
    for entry in logs:  # ProgressCallback.on_log: epoch rounded to 2 digits, then training_bar.write(str(logs))
        shown = dict(entry, epoch=round(entry["epoch"], 2))
        lines.append(str(shown))
    events = _captured(tmp_path, "\n".join(["Some text", *lines, "{'train_runtime': 10.5, 'step': 30}"]) + "\n",
                       preset="hf")
    assert _series(events, "loss") == {1: 2.3141, 3: 1.9}
    assert _series(events, "eval_loss") == {2: 2.2}
    assert _series(events, "learning_rate") == {1: 5e-05, 3: 2.5e-05}
    assert _series(events, "train_runtime") == {30: 10.5}  # a dict that names its step keeps it


def test_an_unknown_preset_is_refused_naming_the_field():
    from pydantic import ValidationError

    from steady.worker.contract.protocol import CaptureSpec

    with pytest.raises(ValidationError) as err:
        CaptureSpec.model_validate({"preset": "fastai"})
    assert err.value.errors()[0]["loc"] == ("preset",)


@pytest.mark.parametrize("text, digits", [("0.2954", 4), ("2.31e-1", 3), ("100", 3), ("0.0012", 2), ("nan", 0),
                                          ("-1.50", 3), ("0", 1)])
def test_significant_digits(text, digits):
    assert significant_digits(text) == digits
