"""What a comparison compared and at which resolution: the facts, and the one place their words are made.

A value reaches the report from one of a few places, each with its own precision:

* **printed text** (a run's stdout or a text log, read by a capture pattern): the digits the script
  printed, no more. Two runs that print ``2.31`` agree to the last printed digit (0.01), whatever their
  bits were; ``resolution`` is that digit's unit and ``decimals`` the digits after the point;
* **binary floats** logged through the SDK (float64, or the tensor's own type), read from TensorBoard
  event files (float32 as TensorBoard stores them) or sent by an MLflow client (float64): compared bit
  for bit in the type they were logged in (``dtype``);
* **digests** of the weights (``initial_weights``, ``final_weights``), the data order or the optimizer
  state: SHA-256 of the bytes, equal only when every bit is.

"Bitwise" is said only where bits were compared: binary values, or a digest. Values parsed from text are
"equal at the N printed decimals". A weight digest that is missing is named, with the reason the run
gave (``digest_notes``) or, without one, that the run recorded none; a data-order (or optimizer-state)
digest is named missing only where a run said why (a Keras run: TensorFlow's input order is not watched).

The stats core (``steady.server.stats.repeatability``, ``report_levels``) builds a :class:`Compared`;
every sentence about it (the reason, the plain first line, the guarantee, the dashboard and the badge,
through the report) comes from the functions below.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Compared", "WEIGHT_DIGESTS", "DIGEST_NAMES", "compared", "decimals", "values_phrase", "equal_phrase",
           "digests_phrase", "equal_short", "same_phrase", "identical_words", "no_longer_words", "guarantee_phrase",
           "NO_DIGEST_REASON"]

WEIGHT_DIGESTS = ("initial_weights", "final_weights")
DIGEST_NAMES = {"initial_weights": "initial-weight", "final_weights": "final-weight", "data_order": "data-order",
                "optimizer_state": "optimizer-state"}
# Why a run has no digest of a kind, when it did not say (runs uploaded from elsewhere, old workers, code
# without a hook Steady knows).
NO_DIGEST_REASON = "the run recorded none"


def decimals(resolution: float) -> int:
    """The digits after the point of a value printed to ``resolution`` (0.01 -> 2; 1 -> 0)."""
    if not resolution > 0 or not math.isfinite(resolution):
        return 0
    return max(0, min(20, -math.floor(math.log10(resolution) + 1e-9)))


def _significant(value: float | None, resolution: float) -> int | None:
    """Significant digits of ``value`` printed to ``resolution`` (2.31 at 0.01 -> 3); None for 0 or none."""
    if value is None or not math.isfinite(value) or value == 0 or not resolution > 0:
        return None
    return max(1, math.floor(math.log10(abs(value))) - math.floor(math.log10(resolution) + 1e-9) + 1)


@dataclass(frozen=True)
class Compared:
    """What the repeats of one group were compared on (facts only; words by the functions below)."""

    basis: str  # "printed": values parsed from text; "binary": floats compared bit for bit
    dtype: str = "float64"  # binary: the type the values were logged in
    resolution: float | None = None  # printed: the unit of the last printed digit (the coarsest of the runs)
    decimals: int | None = None  # printed: digits after the point at that unit
    significant: int | None = None  # printed: significant digits of the last value at that unit
    digests: tuple = ()  # digest kinds every repeat recorded (compared bit for bit)
    missing: Mapping = field(default_factory=dict)  # digest kind -> why a repeat has none (weights always;
    # data order and optimizer state where a run said why)

    def to_data(self) -> dict:
        return {"basis": self.basis, "dtype": self.dtype, "resolution": self.resolution, "decimals": self.decimals,
                "significant": self.significant, "digests": list(self.digests), "missing": dict(self.missing),
                "values": values_phrase(self), "digest_phrase": digests_phrase(self)}


def _present(value) -> bool:
    if value is None:
        return False
    if isinstance(value, (list, tuple, dict, str)):
        return len(value) > 0
    return True


def compared(digests: Sequence[Mapping], notes: Sequence[Mapping], *, resolution: float | None, dtype: str | None,
             last_values: Iterable[float] = ()) -> Compared:
    """The facts of one comparison of repeats: each run's digests (kind -> value) and the notes its code
    left on digests it could not record (kind -> reason); ``resolution``: values parsed from text, the
    coarsest last printed digit (None: binary floats of ``dtype``); ``last_values``: the runs' last values,
    for the significant digits they were printed with."""
    kinds = ("initial_weights", "data_order", "final_weights", "optimizer_state")
    both = tuple(k for k in kinds if digests and all(_present(d.get(k)) for d in digests))
    missing = {}
    for k in kinds:
        if k in both:
            continue
        why = next((str(n[k]) for n in notes if isinstance(n, Mapping) and n.get(k)), None)
        if k in WEIGHT_DIGESTS:
            missing[k] = why or NO_DIGEST_REASON
        elif why:  # data order, optimizer state: named only where a run said why it has none
            missing[k] = why
    if resolution is None:
        return Compared("binary", dtype=dtype or "float64", digests=both, missing=missing)
    last = [abs(v) for v in last_values if v is not None and math.isfinite(v) and v != 0]
    return Compared("printed", dtype=dtype or "float64", resolution=float(resolution), decimals=decimals(resolution),
                    significant=_significant(max(last), resolution) if last else None, digests=both, missing=missing)


def values_phrase(c: Compared) -> str:
    """How the logged values were compared: "at the 2 printed decimals (3 significant digits)" or
    "bit for bit (float32, as logged)"."""
    if c.basis == "printed" and c.resolution is not None:
        n = c.decimals if c.decimals is not None else decimals(c.resolution)
        at = f"at the {n} printed decimal{'s' if n != 1 else ''}" if n > 0 else f"at the printed unit {c.resolution:g}"
        sig = f", {c.significant} significant digit{'s' if c.significant != 1 else ''}" if c.significant else ""
        return f"{at} (values parsed from text{sig}: a difference below {c.resolution:g} is not seen)"
    return f"bit for bit ({c.dtype} values, as logged)"


def _names(kinds: Iterable[str]) -> str:
    words = [DIGEST_NAMES.get(k, k.replace("_", " ")) for k in kinds]
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


def digests_phrase(c: Compared) -> str:
    """Which digests were compared and which weight digests are missing, and why: "initial-weight and
    final-weight digests compared" / "no final-weight digest: no optimizer stepped ..."."""
    parts = []
    if c.digests:
        n = len(c.digests)
        parts.append(f"{_names(c.digests)} digest{'s' if n > 1 else ''} compared")
    by_reason: dict[str, list[str]] = {}
    for k, why in c.missing.items():
        by_reason.setdefault(str(why), []).append(k)
    for why, kinds in by_reason.items():
        parts.append(f"no {_names(kinds)} digest{'s' if len(kinds) > 1 else ''}: {why}")
    return "; ".join(parts)


def equal_phrase(c: Compared | None, n: int | None = None, *, missing: bool = True) -> str:
    """Repeats found equal, in words that claim no more than was compared: "bitwise identical" only when
    the values were binary or the weights' digests were compared; values parsed from text are "equal at
    the 2 printed decimals". ``missing``: also name the weight digests that are missing, and why."""
    across = f" across {n} repeats" if n is not None else ""
    if c is None:
        return f"bitwise identical{across}"
    weights = [k for k in WEIGHT_DIGESTS if k in c.digests]
    if c.basis == "printed":
        head = f"equal{across} {values_phrase(c)}"
        if weights:
            head += f"; the weights bitwise equal ({_names(weights)} digest{'s' if len(weights) > 1 else ''})"
    else:
        head = f"bitwise identical{across} ({c.dtype} values as logged)"
    tail = digests_phrase(Compared(c.basis, digests=tuple(k for k in c.digests if k not in weights),
                                   missing=c.missing if missing else {}))
    return head + (f"; {tail}" if tail else "")


def equal_short(c: Compared | None) -> str:
    """The plain first line's few words: "bitwise equal" only where bits were compared; "equal at the 2
    printed decimals (no weight digest: no optimizer stepped ...)" for values parsed from text."""
    if c is None or c.basis != "printed" or c.resolution is None:
        return "bitwise equal"
    n = c.decimals or 0
    what = f"equal at the {n} printed decimal{'s' if n != 1 else ''}" if n else f"equal at the printed unit {c.resolution:g}"
    weights = [k for k in WEIGHT_DIGESTS if k in c.digests]
    if weights:
        return what + ", weights bitwise equal (digests)"
    why = next((c.missing[k] for k in WEIGHT_DIGESTS if c.missing.get(k, NO_DIGEST_REASON) != NO_DIGEST_REASON),
               None)
    return what + (f" (no weight digest: {why})" if why else " (no weight digest recorded)")


def same_phrase(c: Compared | None) -> str:
    """Runs (of different seeds) that gave the same values: "bitwise identical", or for values parsed from
    text "equal at the 2 printed decimals" (with "and their weight digests" where those were compared too)."""
    if c is None or c.basis != "printed" or c.resolution is None:
        return "bitwise identical"
    n = c.decimals or 0
    what = f"equal at the {n} printed decimal{'s' if n != 1 else ''}" if n else f"equal at the printed unit {c.resolution:g}"
    weights = [k for k in WEIGHT_DIGESTS if k in c.digests]
    return what + (" with bitwise equal weight digests" if weights else " (no weight digest to tell them apart)")


def identical_words(resolution: float | None) -> str:
    """Two series found equal: "bitwise identical" for binary floats, "equal at the 2 printed decimals" for
    values parsed from text (``resolution``: the unit of their last printed digit)."""
    if resolution is None:
        return "bitwise identical"
    n = decimals(resolution)
    return f"equal at the {n} printed decimal{'s' if n != 1 else ''}" if n else f"equal at the printed unit {resolution:g}"


def no_longer_words(resolution: float | None, *, digest_only: bool = False) -> str:
    """Repeats that were equal and are not any more, at the resolution compared: "no longer bitwise identical"
    for binary floats, or where only a digest differs (``digest_only``: every logged value equal, a digest's
    bits not); "no longer equal at the 2 printed decimals" for values parsed from text."""
    if digest_only:
        return "no longer bitwise identical (a digest differs; the logged values do not)"
    return f"no longer {identical_words(resolution)}"


def guarantee_phrase(c: Compared | None) -> str:
    """The repeatability rule's guarantee, naming the resolution it holds at."""
    if c is None:
        return "exact (bitwise or atol/rtol comparison, no false alarm)"
    if c.basis != "printed" or c.resolution is None:
        return f"exact (bitwise comparison of the {c.dtype} values as logged and of the digests, or atol/rtol; no false alarm)"
    return (f"exact at the printed precision only: values parsed from text compared to their last printed digit "
            f"({c.resolution:g}); a difference below it is not seen (no false alarm)")
