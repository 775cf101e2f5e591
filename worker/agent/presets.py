"""Readers of output lines: the capture spec's regex patterns and the presets for common logging shapes.

Each reader takes one drawn line (a line, or one redraw of a ``\\r``-redrawn progress bar, ANSI colours
removed) and returns the readings it holds: ``(step, {key: text})``. The text is kept, not only the
number, so a value can be compared with another channel's at the precision it was printed with
(:mod:`steady.worker.agent.conflicts`).

The presets read what the libraries print, as they print it:

``keras``      ``model.fit``: an ``Epoch 3/10`` line, then (``verbose=2``) ``2/2 - 0s - 185ms/step -
               accuracy: 0.7500 - loss: 0.6370 - val_loss: 0.6337`` or (``verbose=1``) a progress bar
               redrawn with ``\\r`` whose last redraw holds the epoch's values. Step: the epoch (from 1).
``hf``         the Hugging Face Trainer's log lines, ``{'loss': 2.31, 'learning_rate': 5e-05, 'epoch': 0.5}``.
               Step: the dict's ``step`` or ``global_step`` when it has one, else the line's number among
               the dict lines the run printed (1, 2, 3…), the same in every run of one script.
``lightning``  PyTorch Lightning's progress bar, ``Epoch 2: 100%|…| 32/32 [00:01<00:00, v_num=0,
               train_loss=0.693]``. Step: the epoch (from 0, as Lightning prints it); ``v_num`` is not a metric.
``tqdm``       any tqdm bar's postfix, ``50/100 [00:01<00:01, 45.2it/s, loss=2.31, acc=0.91]``: every
               ``name=number`` of it. Step: the bar's count.
``mnist``      pytorch/examples' mnist: ``Train Epoch: 2 [640/60000 (1%)]\tLoss: 0.123456`` gives ``loss`` at
               the global sample count, (epoch − first epoch) × 60000 + 640; ``Test set: Average loss: 0.0338,
               Accuracy: 9887/10000 (99%)`` gives ``test_loss`` and ``test_accuracy`` (9887/10000 = 0.9887) at
               the epoch of the training lines before it.
``word_language_model``  pytorch/examples' word_language_model: ``| epoch   2 |   200/ 2983 batches | lr 20.00 |
               ms/batch 45.49 | loss  6.48 | ppl   652.3`` gives ``loss``, ``ppl`` and ``lr`` at the global batch,
               (epoch − first epoch) × 2983 + 200; ``| end of epoch   2 | time: 141.92s | valid loss  5.58 |
               valid ppl   265.07`` gives ``valid_loss`` and ``valid_ppl`` at the epoch; ``| End of training |
               test loss  5.52 | test ppl   249.36`` gives ``test_loss`` and ``test_ppl`` at the last epoch.

A capture pattern may name an ``epoch`` group beside ``step`` (a script that prints the batch index *within*
the epoch): its readings are placed on one global step series ordered by (epoch, step within the epoch). The
first epoch's steps are kept as printed; each later epoch starts one past the largest global step of the
epoch before it (``EpochSteps``), so every value of a 3-epoch run is kept, none overwrites another, and the
same script prints the same global steps in every run.

Every regex here, and every pattern of a capture spec, runs on RE2 (:mod:`steady.worker.contract.linear_re`):
time linear in the line whatever the pattern, so a run's output can slow only its own capture.
"""

from __future__ import annotations

import decimal
from typing import Protocol

from steady.worker.contract.linear_re import compile_linear
from steady.worker.contract.protocol import CapturePreset

NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|NaN|inf|Inf)"
Reading = tuple[int, dict[str, str]]

__all__ = ["NUMBER", "PRESETS", "EpochSteps", "PatternReader", "epoch_pattern", "Reader", "Reading", "preset_reader", "printed_precision",
           "printed_resolution", "significant_digits"]


class Reader(Protocol):
    def read(self, line: str) -> list[Reading]: ...


def printed_precision(text: str) -> tuple[int, float | None]:
    """How precisely ``text`` prints a number, from one parse: its significant digits ("0.2954" -> 4,
    "2.31e-1" -> 3, "100" -> 3; what the conflict check compares two readings at) and the unit of its last
    digit ("0.2954" -> 1e-4, "2.31e-1" -> 1e-3, "12" -> 1; what the server knows a parsed value to).
    ``(0, None)`` for NaN and infinities (which compare exactly) and for what is not a number."""
    try:
        sign, digits, exponent = decimal.Decimal(text.strip()).as_tuple()
    except (decimal.InvalidOperation, ValueError):
        return 0, None
    if not isinstance(exponent, int):  # 'n', 'N', 'F': NaN, sNaN, infinity
        return 0, None
    significant = max(1, len("".join(map(str, digits)).lstrip("0")))
    return significant, (float(10.0 ** exponent) if -300 < exponent < 300 else None)


def significant_digits(text: str) -> int:
    return printed_precision(text)[0]


def printed_resolution(text: str) -> float | None:
    return printed_precision(text)[1]


class EpochSteps:
    """One global step series from (epoch, step within the epoch) readings: the first epoch's steps as printed,
    each later epoch offset to start one past the largest global step of the epoch before it. A reading of an
    epoch seen before (its lines interleaved with a new one's) keeps that epoch's offset."""

    def __init__(self) -> None:
        self.offsets: dict[int, int] = {}
        self.top = -1  # the largest global step so far

    def global_step(self, epoch: int, step: int) -> int:
        if epoch not in self.offsets:
            self.offsets[epoch] = 0 if not self.offsets else self.top + 1
        g = self.offsets[epoch] + step
        self.top = max(self.top, g)
        return g


class PatternReader:
    """A capture pattern: a regex with a named group ``step``, optionally ``epoch``, and one per metric.
    With ``epoch``, the step read is the global one (``EpochSteps``)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.rx = compile_linear(pattern)
        self.epochs = EpochSteps() if "epoch" in self.rx.groupindex else None

    def read(self, line: str) -> list[Reading]:
        m = self.rx.search(line)
        if m is None:
            return []
        try:
            step = int(m.group("step"))
            if self.epochs is not None:
                step = self.epochs.global_step(int(m.group("epoch")), step)
        except (TypeError, ValueError, IndexError):
            return []
        values = {name: text for name, text in m.groupdict().items()
                  if name not in ("step", "epoch") and text is not None}
        return [(step, values)] if values else []


class KerasReader:
    _EPOCH = compile_linear(r"^\s*Epoch (\d+)/\d+\s*$")
    _PAIR = compile_linear(r" - ([A-Za-z_][A-Za-z0-9_./]*): (" + NUMBER + r")\b")

    def __init__(self) -> None:
        self.epoch: int | None = None

    def read(self, line: str) -> list[Reading]:
        m = self._EPOCH.match(line)
        if m:
            self.epoch = int(m.group(1))
            return []
        if self.epoch is None:
            return []
        values = dict(self._PAIR.findall(line))
        return [(self.epoch, values)] if values else []


class HuggingFaceReader:
    _PAIR = compile_linear(r"'([A-Za-z_][A-Za-z0-9_./\-]*)': (?:np\.float\d+\()?(" + NUMBER + r")\b")
    _STEP_KEYS = ("step", "global_step")

    def __init__(self) -> None:
        self.lines = 0

    def read(self, line: str) -> list[Reading]:
        text = line.strip()
        if not (text.startswith("{") and text.endswith("}")):
            return []
        values = dict(self._PAIR.findall(text))
        if not values:
            return []
        self.lines += 1
        step = self.lines
        for key in self._STEP_KEYS:
            if key in values:
                try:
                    step = int(float(values.pop(key)))
                except ValueError:
                    return []
        return [(step, values)] if values else []


_POSTFIX_PAIR = compile_linear(r"([A-Za-z_][A-Za-z0-9_./\-]*)=(" + NUMBER + r")\b")


class TqdmReader:
    _BAR = compile_linear(r"(\d+)(?:/\d+|it) \[\d+:\d\d")

    def read(self, line: str) -> list[Reading]:
        m = self._BAR.search(line)
        if m is None:
            return []
        values = dict(_POSTFIX_PAIR.findall(line, m.end()))
        return [(int(m.group(1)), values)] if values else []


class LightningReader:
    _EPOCH = compile_linear(r"\bEpoch (\d+):")
    _SKIP = ("v_num",)

    def read(self, line: str) -> list[Reading]:
        m = self._EPOCH.search(line)
        if m is None:
            return []
        values = {k: v for k, v in _POSTFIX_PAIR.findall(line, m.end()) if k not in self._SKIP}
        return [(int(m.group(1)), values)] if values else []


_EPOCH_PREFIX = r"(?i)\bepoch\b\D*?(?P<epoch>\d+)[^\n]*?"


def epoch_pattern(pattern: str, line: str) -> str | None:
    """``pattern`` (a step-only capture pattern) with an ``epoch`` group read from the word "epoch" before it,
    when ``line`` shows an epoch number and the new pattern reads it with the same metrics; else None."""
    if "epoch" in compile_linear(pattern).groupindex or "epoch" not in line.lower():
        return None
    candidate = _EPOCH_PREFIX + pattern
    try:
        rx = compile_linear(candidate)
    except ValueError:  # PatternError: a pattern the prefix makes unreadable gets no suggestion
        return None
    m = rx.search(line)
    if m is None or m.group("step") is None or m.group("epoch") is None:
        return None
    return candidate


class _EpochLength:
    """The global step of a script that prints the position within an epoch and the epoch's length:
    (epoch − the first epoch printed) × length + position."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.epoch: int | None = None  # the epoch of the last training line

    def global_step(self, epoch: int, position: int, length: int) -> int:
        if self.first is None:
            self.first = epoch
        self.epoch = epoch
        return (epoch - self.first) * length + position


class MnistReader(_EpochLength):
    _TRAIN = compile_linear(r"Train Epoch: (\d+) \[(\d+)/(\d+) \([^)]*\)\]\s+Loss: (" + NUMBER + r")")
    _TEST = compile_linear(r"Test set: Average loss: (" + NUMBER + r"), Accuracy: (\d+)/(\d+)")

    def read(self, line: str) -> list[Reading]:
        m = self._TRAIN.search(line)
        if m:
            return [(self.global_step(int(m.group(1)), int(m.group(2)), int(m.group(3))), {"loss": m.group(4)})]
        m = self._TEST.search(line)
        if m is None:
            return []
        correct, total = int(m.group(2)), int(m.group(3))
        values = {"test_loss": m.group(1)}
        if total > 0:
            values["test_accuracy"] = repr(correct / total)
        return [(self.epoch if self.epoch is not None else 0, values)]


class WordLanguageModelReader(_EpochLength):
    _TRAIN = compile_linear(r"\|\s*epoch\s+(\d+)\s*\|\s*(\d+)\s*/\s*(\d+) batches\s*\|")
    _END = compile_linear(r"\|\s*end of epoch\s+(\d+)\s*\|")
    _FINAL = compile_linear(r"\|\s*End of training\s*\|")
    _PAIR = compile_linear(r"\|\s*(lr|loss|ppl|valid loss|valid ppl|test loss|test ppl)\s+(" + NUMBER + r")")

    def read(self, line: str) -> list[Reading]:
        pairs = {name.replace(" ", "_"): text for name, text in self._PAIR.findall(line)}
        if not pairs:
            return []
        m = self._TRAIN.search(line)
        if m:
            values = {k: v for k, v in pairs.items() if k in ("lr", "loss", "ppl")}
            step = self.global_step(int(m.group(1)), int(m.group(2)), int(m.group(3)))
            return [(step, values)] if values else []
        m = self._END.search(line)
        if m:
            values = {k: v for k, v in pairs.items() if k.startswith("valid_")}
            return [(int(m.group(1)), values)] if values else []
        if self._FINAL.search(line):
            values = {k: v for k, v in pairs.items() if k.startswith("test_")}
            return [(self.epoch if self.epoch is not None else 0, values)] if values else []
        return []


PRESETS: dict[str, type] = {"keras": KerasReader, "hf": HuggingFaceReader, "lightning": LightningReader,
                            "tqdm": TqdmReader, "mnist": MnistReader, "word_language_model": WordLanguageModelReader}


def preset_reader(name: CapturePreset | str) -> Reader:
    """A fresh reader (its own state: Keras' current epoch, the Trainer's line count) for one run."""
    reader: Reader = PRESETS[name]()
    return reader
