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

__all__ = ["NUMBER", "PRESETS", "PatternReader", "Reader", "Reading", "preset_reader", "printed_precision",
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


class PatternReader:
    """A capture pattern: a regex with a named group ``step`` and one per metric."""

    def __init__(self, pattern: str) -> None:
        self.rx = compile_linear(pattern)

    def read(self, line: str) -> list[Reading]:
        m = self.rx.search(line)
        if m is None:
            return []
        try:
            step = int(m.group("step"))
        except (TypeError, ValueError, IndexError):
            return []
        values = {name: text for name, text in m.groupdict().items() if name != "step" and text is not None}
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


PRESETS: dict[str, type] = {"keras": KerasReader, "hf": HuggingFaceReader, "lightning": LightningReader,
                            "tqdm": TqdmReader}


def preset_reader(name: CapturePreset | str) -> Reader:
    """A fresh reader (its own state: Keras' current epoch, the Trainer's line count) for one run."""
    reader: Reader = PRESETS[name]()
    return reader
