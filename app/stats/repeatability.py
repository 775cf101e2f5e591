"""Repeatability: are runs with the same seed, stack and determinism level identical?"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from steady.server.stats.align import align_series
from steady.server.stats.distributed import DistributedCause, distributed_cause
from steady.server.stats.resolution import compared, equal_phrase

__all__ = ["RepeatRun", "Repeatability", "repeatability", "size_phrase", "stopped_phrase", "ulp_distance",
           "VERDICT_ORDER"]

IDENTICAL, WITHIN, OUT, INCONCLUSIVE = "identical", "within_tolerance", "out_of_tolerance", "inconclusive"
VERDICT_ORDER = {IDENTICAL: 0, WITHIN: 1, OUT: 2}  # worst case = highest
_SIGN = np.int64(-(2**63))


FLOAT_DTYPES = {"float64": (np.float64, np.int64), "float32": (np.float32, np.int32),
                "float16": (np.float16, np.int16), "bfloat16": None}


def _ordered(bits: np.ndarray) -> np.ndarray:
    """Map float64 bit patterns to int64 so that integer order equals float order."""
    return np.where(bits < 0, _SIGN - bits, bits)


def ulp_distance(a, b, dtype: str = "float64") -> np.ndarray:
    """Number of representable values of ``dtype`` between a and b (uint64; 0 where bitwise
    equal, and +0/−0 are 0 apart). Values are rounded to ``dtype`` first, so a series logged in
    float32 and stored as float64 counts float32 ULPs (one float32 ULP is 2**29 float64 ULPs).
    ``bfloat16`` counts float32 ULPs divided by 2**16 (its ULP is 2**16 float32 ULPs).
    Meaningful for finite inputs only (Dawson, "Comparing floating point numbers", 2012)."""
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(FLOAT_DTYPES)}, got {dtype!r}")
    if dtype == "bfloat16":
        return ulp_distance(a, b, "float32") >> np.uint64(16)
    views = FLOAT_DTYPES[dtype]
    assert views is not None  # only bfloat16 has none: handled above
    ftype, itype = views
    with np.errstate(over="ignore", invalid="ignore"):
        ia = np.asarray(a, np.float64).astype(ftype).view(itype).astype(np.int64)
        ib = np.asarray(b, np.float64).astype(ftype).view(itype).astype(np.int64)
    bits = np.iinfo(itype).bits
    # sign-magnitude → two's complement ordering at the type's own width, then widen
    sign = np.int64(1) << np.int64(bits - 1)
    oa = np.where(ia < 0, -(ia & (sign - 1)), ia) if bits < 64 else _ordered(ia)
    ob = np.where(ib < 0, -(ib & (sign - 1)), ib) if bits < 64 else _ordered(ib)
    if bits < 64:
        return np.abs(oa - ob).astype(np.uint64)
    ua, ub = oa.view(np.uint64), ob.view(np.uint64)
    return np.where(oa >= ob, ua - ub, ub - ua)


@dataclass(frozen=True)
class RepeatRun:
    """One run of a repeat group: its metric series and provenance."""

    steps: np.ndarray
    values: np.ndarray
    fingerprint: Mapping | None = None
    initial_weights: str | None = None
    data_order: Sequence[str] = ()
    other_digests: Mapping | None = None  # e.g. final_weights, optimizer_state
    dtype: str | None = None  # the logged value's type (float32, …); None: float64
    # Values parsed from printed text (stdout): the unit of their last printed digit (1e-4 for "0.1234").
    # They carry no binary precision, so their difference is counted in that unit, not in ULPs. None: binary floats.
    resolution: float | None = None
    # A multi-process run's per-rank record (steady.worker.contract.distributed): names the distributed layer.
    distributed: Mapping | None = None


@dataclass(frozen=True)
class Repeatability:
    verdict: str
    n_runs: int
    atol: float
    rtol: float
    values_identical: bool
    digests_identical: bool
    steps_identical: bool
    max_abs_delta: float
    max_rel_delta: float
    max_ulps: int | None  # None when a run's values were parsed from text (``resolution``)
    first_divergent_step: int | None  # first step whose bits differ from the reference run
    first_out_of_tolerance_step: int | None
    source: str | None  # stack | seeding | data_order | distributed | numerics | None when identical
    data_order_epoch: int | None  # first epoch whose data-order digest differs
    reason: str
    dtype: str = "float64"  # the type ULPs are counted in
    resolution: float | None = None  # values parsed from text: the coarsest last printed digit of the runs
    # Values are compared at the steps every repeat logged: how many there were (None: fewer than 2 runs),
    # and each run's last logged step (repeats that stop at different steps differ, whatever their values)
    steps_compared: int | None = None
    last_steps: tuple = ()


def size_phrase(max_abs: float, max_ulps: int | None, resolution: float | None, dtype: str = "float64") -> str:
    """The size of a difference: in ULPs of ``dtype`` for binary floats; for values parsed from printed
    text, in units of their last printed digit (``resolution``), the precision they were printed with."""
    if resolution is not None or max_ulps is None:
        if resolution is None:
            return f"max |Δ| {max_abs:.3g}"
        units = f"{max_abs / resolution:.0f}" if np.isfinite(max_abs) else "∞"
        return (f"max |Δ| {max_abs:.{_decimals(resolution)}f} ({units} in the last printed digit, {resolution:g}, "
                "of values parsed from text)")
    return f"max |Δ| {max_abs:.3g}, {max_ulps} {dtype} ULPs"


def stopped_phrase(last_steps) -> str:
    """``they stopped at steps 325 and 790`` (each distinct last step once), or ``they all stopped at step 790``."""
    distinct = sorted({s for s in last_steps if s is not None})
    if not distinct:
        return "they logged no step"
    if len(distinct) == 1:
        return f"they all stopped at step {distinct[0]:,}"
    listed = ", ".join(f"{s:,}" for s in distinct[:-1]) + f" and {distinct[-1]:,}"
    return f"they stopped at steps {listed}"


def _decimals(resolution: float) -> int:
    return max(0, min(20, -int(np.floor(np.log10(resolution) + 1e-9)))) if resolution > 0 else 6


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.view(np.int64) == b.view(np.int64)


UNSEEDED_INIT = ("no initial-weight digest to go on, and at determinism level none nothing is seeded: a "
                 "difference from the first logged step is unseeded initialisation, not kernels")


def repeatability(runs: Sequence[RepeatRun], *, atol: float = 0.0, rtol: float = 0.0,
                  dtype: str | None = None, determinism: str | None = None) -> Repeatability:
    """Compare repeats of one seed against the first run (the reference).

    Verdict ``identical`` when every logged value (compared by float64 bits, so NaN == NaN
    when the bits match) and every digest is equal; ``within_tolerance`` when every value pair
    satisfies |a − b| ≤ atol + rtol·|b| (b = reference; the ``numpy.isclose`` rule; non-finite
    values must be bitwise equal); ``out_of_tolerance`` otherwise (including a step logged by
    one run and not another); ``inconclusive`` with fewer than two runs.

    The source of the first divergence is attributed in this order (docs/controls.md):
    ``stack`` when fingerprints differ, else ``seeding`` when initial-weight digests differ,
    else ``data_order`` (with the first differing epoch) when data-order digests differ, else
    ``distributed`` when multi-process runs' per-rank records show it (a rank's state disagreeing with
    rank 0's, or the same computed gradients all-reduced to different ones: ``steady.server.stats.distributed``),
    else ``numerics`` (kernels, reduction order, threads). One exception: at ``determinism="none"``
    (Steady applied no seed) with no initial-weight digest in any run, a divergence already at
    the first logged step is attributed to ``seeding`` (unseeded initialisation makes every
    value differ from the start; kernel nondeterminism needs a computation to act on first),
    and the reason says so. Deltas in ULPs follow Dawson (2012),
    counted in ``dtype`` (default: the reference run's ``dtype``, else float64); a pair of
    values where one is non-finite has no ULP distance and is reported as such.
    """
    if atol < 0 or rtol < 0 or not np.isfinite(atol) or not np.isfinite(rtol):
        raise ValueError(f"atol and rtol must be finite and >= 0, got {atol!r}, {rtol!r}")
    runs = list(runs)
    nan = float("nan")
    if len(runs) < 2:
        return Repeatability(INCONCLUSIVE, len(runs), float(atol), float(rtol), True, True, True, nan, nan, 0,
                             None, None, None, None, f"{len(runs)} run(s): need at least 2 repeats to compare")
    al = align_series({i: (r.steps, r.values) for i, r in enumerate(runs)})
    ref, ref_present = al.values[0], al.present[0]
    others, present = al.values[1:], al.present[1:]
    steps_identical = bool((present == ref_present[None, :]).all())
    bits_equal = _same_bits(others, np.broadcast_to(ref, others.shape)) & (present == ref_present[None, :])
    values_identical = bool(bits_equal.all())

    fins = [dict(r.fingerprint or {}) for r in runs]
    inits = [r.initial_weights for r in runs]
    orders = [list(r.data_order or ()) for r in runs]
    extras = [dict(r.other_digests or {}) for r in runs]
    digests_identical = all(i == inits[0] for i in inits) and all(o == orders[0] for o in orders) and all(
        e == extras[0] for e in extras)

    both = present & ref_present[None, :]
    finite = both & np.isfinite(others) & np.isfinite(ref)[None, :]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        absd = np.where(finite, np.abs(others - ref[None, :]), 0.0)
        scale = np.where(finite, np.abs(np.broadcast_to(ref, others.shape)), 0.0)
        reld = np.where(finite & (absd > 0), absd / np.where(scale > 0, scale, np.inf), 0.0)
        reld = np.where(finite & (absd > 0) & (scale == 0), np.inf, reld)
    ok = np.where(finite, absd <= atol + rtol * scale, bits_equal)
    ok &= present == ref_present[None, :]
    dtype = dtype or runs[0].dtype or "float64"
    if dtype not in FLOAT_DTYPES:
        dtype = "float64"
    ulps = np.where(finite, ulp_distance(others, np.broadcast_to(ref, others.shape), dtype), 0)
    resolution = max((r.resolution for r in runs if r.resolution is not None), default=None)
    nonfinite_mismatch = bool((both & ~finite & ~bits_equal).any())

    def first_bad(mask_ok):
        cols = np.flatnonzero(~mask_ok.all(axis=0))
        return int(al.steps[cols[0]]) if cols.size else None

    first_div = first_bad(bits_equal)
    first_oot = first_bad(ok)
    max_abs = float(absd.max()) if absd.size else 0.0
    max_rel = float(reld.max()) if reld.size else 0.0
    if nonfinite_mismatch:
        max_abs = max_rel = float("inf")
    max_ulps: int | None = (int(ulps.max()) if ulps.size else 0) if resolution is None else None

    source = epoch = None
    dist: DistributedCause | None = None
    if not (values_identical and digests_identical):
        if any(f != fins[0] for f in fins):
            source = "stack"
        elif any(i != inits[0] for i in inits):
            source = "seeding"
        elif any(o != orders[0] for o in orders):
            source = "data_order"
            epoch = min(next((e for e, (a, b) in enumerate(zip(orders[0], o)) if a != b), min(len(o), len(orders[0])))
                        for o in orders[1:] if o != orders[0])
        elif (dist := distributed_cause([r.distributed for r in runs])) is not None:
            source = "distributed"
        elif (determinism == "none" and all(i is None for i in inits) and first_div is not None
              and al.steps.size and first_div == int(al.steps[0])):
            source = "seeding"
        else:
            source = "numerics"

    n = len(runs)
    steps_compared = int(al.present.all(axis=0).sum()) if al.steps.size else 0
    last_steps = tuple(int(r.steps[-1]) if len(r.steps) else None for r in runs)
    if values_identical and digests_identical:
        verdict, reason = IDENTICAL, equal_phrase(compared(
            [{"initial_weights": r.initial_weights, "data_order": list(r.data_order or ()), **(r.other_digests or {})}
             for r in runs], [], resolution=resolution, dtype=dtype), n, missing=False)
    else:
        verdict = WITHIN if bool(ok.all()) else OUT
        where = "digests differ, values identical" if values_identical else (
            f"first divergence at step {first_div}" if first_div is not None else "values differ")
        if not steps_identical and steps_compared == 0:
            where = f"the repeats share no logged step: their values were not compared; {stopped_phrase(last_steps)}"
        elif not steps_identical:
            where += f"; logged steps differ ({steps_compared:,} common step(s) compared; {stopped_phrase(last_steps)})"
        src = f"source: {source}" + (f", epoch {epoch}" if epoch is not None else "")
        if source == "seeding" and all(i is None for i in inits):
            src += f"; {UNSEEDED_INIT}"
        if source == "distributed" and dist is not None:
            src += f"; {dist.detail}"
        size = ("no value compared" if steps_compared == 0 else
                size_phrase(max_abs, max_ulps, resolution, dtype) if not nonfinite_mismatch else
                f"a value is non-finite in one repeat and not the other "
                f"({size_phrase(float(absd.max()) if absd.size else 0.0, max_ulps, resolution, dtype)} of finite values)")
        reason = f"{where} ({src}), {size}"
        if verdict == OUT and first_oot is not None and steps_compared:
            reason += f"; outside atol={atol:g}/rtol={rtol:g} from step {first_oot}"
    return Repeatability(verdict, n, float(atol), float(rtol), values_identical, digests_identical,
                         steps_identical, max_abs, max_rel, max_ulps, first_div, first_oot, source, epoch, reason,
                         dtype, resolution, steps_compared, last_steps)
