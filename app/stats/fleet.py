"""Fleet checks: which worker computes differently from its peers?

One workload, run ``repeats`` times on each worker of a pool at ``strict``. Workers whose stack fingerprint
is the same must produce the same bits; :func:`fleet_check` groups the runs by fingerprint, finds each group's
majority result (the digests and every per-step value, compared bit for bit) and names every worker with a run
that parts from it: the first step where it parts, how many of its repeats part, and whether its repeats agree
with each other (a consistent fault: a wrong kernel, another reduction order) or not (an intermittent one: a bit
flip now and then).

The naming rule: a worker is named when one of its runs parts from its group's majority, and only when the
group has one (a result more than half its runs share). Its false-alarm level is 0 under its condition: a
healthy device runs the workload bit-repeatably at ``strict`` (the built-in canary does, on CPU); a workload
that parts on healthy devices leaves no majority, or a majority that other workers also part from, and the
group says so instead of naming one worker (``tests/fleet/test_fleet_stats.py`` checks both by simulation).

A fault that strikes 1 step in K is seen by ``n`` steps with probability ``1 − (1 − 1/K)^n`` (a run with one
wrong step parts from the majority from that step on): :func:`seen_probability`, :func:`rate_seen` and
:func:`repeats_for` state and plan it.

Step time is not a numerics fault: a worker is named slow when the median of its step times is at least
``slow_ratio`` times the median of its group's other workers and a one-sided Mann–Whitney test of its step
times against theirs rejects at ``alpha / workers`` (Bonferroni over the workers of the group).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["FleetRun", "WorkerFinding", "SlowWorker", "FleetGroup", "FleetResult", "fleet_check",
           "fingerprint_key", "seen_probability", "rate_seen", "repeats_for"]

# fingerprint keys that name a path or a host's own place, not the stack it computes with
_NOT_STACK = ("python_executable",)
DIGEST_KINDS = ("initial_weights", "final_weights", "optimizer_state")


def fingerprint_key(fingerprint: Mapping) -> str:
    """A short, stable name of a stack fingerprint (what must agree for runs to be compared bit for bit)."""
    kept = {k: v for k, v in fingerprint.items() if k not in _NOT_STACK}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class FleetRun:
    """One run of a fleet check. ``series``: metric key → (steps int64, values float64), the values compared
    bit for bit; ``step_times``: its step times in seconds (may be empty)."""

    run_id: int
    worker: str
    group: str
    digests: Mapping = field(default_factory=dict)
    series: Mapping = field(default_factory=dict)
    step_times: np.ndarray = field(default_factory=lambda: np.empty(0))


@dataclass(frozen=True)
class WorkerFinding:
    """A worker whose runs part from its group's majority."""

    worker: str
    group: str
    runs: int
    parted: int  # of its runs, how many part from the majority
    consistent: bool  # its runs all part and agree with each other (else intermittent)
    first_step: int | None  # the earliest step where one of its runs parts (None: only a digest parts)
    metric: str | None  # the metric that parts at first_step
    digests: tuple[str, ...]  # digest kinds that part (final weights, optimizer state…)
    run_ids: tuple[int, ...]  # its runs that part


@dataclass(frozen=True)
class SlowWorker:
    worker: str
    group: str
    ratio: float  # its median step time over the median of the group's other workers
    median_s: float
    others_median_s: float
    p_value: float  # one-sided Mann–Whitney: its step times are larger
    threshold: float  # alpha / workers in the group


@dataclass(frozen=True)
class FleetGroup:
    group: str
    workers: tuple[str, ...]
    runs: int
    majority_runs: int  # runs with the majority result (0: no majority)
    has_majority: bool
    findings: tuple[WorkerFinding, ...]
    steps_per_run: int  # steps every run of the group logged (the fewest)


@dataclass(frozen=True)
class FleetResult:
    groups: tuple[FleetGroup, ...]
    slow: tuple[SlowWorker, ...]
    slow_ratio: float
    alpha: float


def _signature(run: FleetRun) -> str:
    h = hashlib.sha256()
    for kind in DIGEST_KINDS:
        h.update(f"{kind}={run.digests.get(kind)};".encode())
    for key in sorted(run.series):
        steps, values = run.series[key]
        h.update(key.encode())
        h.update(np.ascontiguousarray(steps, dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(values, dtype=np.float64).tobytes())
    return h.hexdigest()


def _first_parting(run: FleetRun, ref: FleetRun) -> tuple[int | None, str | None]:
    """The first step (and its metric) where ``run``'s values part bit for bit from ``ref``'s."""
    best: tuple[int | None, str | None] = (None, None)
    for key in sorted(set(run.series) | set(ref.series)):
        if key not in run.series or key not in ref.series:
            continue
        s1, v1 = (np.asarray(a) for a in run.series[key])
        s2, v2 = (np.asarray(a) for a in ref.series[key])
        common, i1, i2 = np.intersect1d(s1, s2, return_indices=True)
        bits1 = np.ascontiguousarray(v1[i1], dtype=np.float64).view(np.int64)
        bits2 = np.ascontiguousarray(v2[i2], dtype=np.float64).view(np.int64)
        differ = np.flatnonzero(bits1 != bits2)
        step = int(common[differ[0]]) if differ.size else None
        if step is None and not np.array_equal(np.setxor1d(s1, s2), np.empty(0, dtype=s1.dtype)):
            step = int(np.setxor1d(s1, s2)[0])  # one logged a step the other did not
        if step is not None and (best[0] is None or step < best[0]):
            best = (step, key)
    return best


def _group(name: str, runs: Sequence[FleetRun]) -> FleetGroup:
    sigs = {r.run_id: _signature(r) for r in runs}
    counts = Counter(sigs.values())
    top, top_n = counts.most_common(1)[0]
    has_majority = top_n * 2 > len(runs)
    workers = tuple(sorted({r.worker for r in runs}))
    steps = min((min((len(s) for s, _ in r.series.values()), default=0) for r in runs), default=0)
    findings = []
    if has_majority:
        ref = next(r for r in runs if sigs[r.run_id] == top)
        for w in workers:
            mine = [r for r in runs if r.worker == w]
            parted = [r for r in mine if sigs[r.run_id] != top]
            if not parted:
                continue
            partings = [_first_parting(r, ref) for r in parted]
            steps_seen = [(step, key) for step, key in partings if step is not None]
            first: tuple[int | None, str | None] = min(steps_seen) if steps_seen else (None, None)
            digests = tuple(k for k in DIGEST_KINDS if any(r.digests.get(k) != ref.digests.get(k) for r in parted))
            consistent = len(parted) == len(mine) and len({sigs[r.run_id] for r in parted}) == 1
            findings.append(WorkerFinding(worker=w, group=name, runs=len(mine), parted=len(parted),
                                          consistent=consistent, first_step=first[0], metric=first[1],
                                          digests=digests, run_ids=tuple(r.run_id for r in parted)))
    return FleetGroup(group=name, workers=workers, runs=len(runs), majority_runs=top_n if has_majority else 0,
                      has_majority=has_majority, findings=tuple(findings), steps_per_run=steps)


def _slow(name: str, runs: Sequence[FleetRun], *, slow_ratio: float, alpha: float) -> list[SlowWorker]:
    by_worker: dict[str, np.ndarray] = {}
    for r in runs:
        times = np.asarray(r.step_times, dtype=np.float64)
        times = times[np.isfinite(times)]
        by_worker[r.worker] = np.concatenate([by_worker.get(r.worker, np.empty(0)), times])
    if len(by_worker) < 2:
        return []
    import scipy.stats  # here, not at import: the web app imports scipy only where a statistic is computed

    threshold = alpha / len(by_worker)
    out = []
    for w, mine in sorted(by_worker.items()):
        others = np.concatenate([t for o, t in by_worker.items() if o != w])
        if mine.size < 2 or others.size < 2:
            continue
        median, others_median = float(np.median(mine)), float(np.median(others))
        if others_median <= 0 or median < slow_ratio * others_median:
            continue
        p = float(scipy.stats.mannwhitneyu(mine, others, alternative="greater").pvalue)
        if p < threshold:
            out.append(SlowWorker(worker=w, group=name, ratio=median / others_median, median_s=median,
                                  others_median_s=others_median, p_value=p, threshold=threshold))
    return out


def fleet_check(runs: Sequence[FleetRun], *, slow_ratio: float = 5.0, alpha: float = 0.01) -> FleetResult:
    """Group ``runs`` by fingerprint, name the workers that part from their group's majority (see the module's
    docstring for the rule and its condition) and those markedly slower than their group's other workers."""
    if not (slow_ratio > 1 and 0 < alpha < 1):
        raise ValueError(f"slow_ratio must be > 1 and alpha in (0, 1), got {slow_ratio!r}, {alpha!r}")
    names = sorted({r.group for r in runs})
    groups = tuple(_group(g, [r for r in runs if r.group == g]) for g in names)
    slow = tuple(s for g in names for s in _slow(g, [r for r in runs if r.group == g], slow_ratio=slow_ratio,
                                                  alpha=alpha))
    return FleetResult(groups=groups, slow=slow, slow_ratio=slow_ratio, alpha=alpha)


def seen_probability(steps: int, rate: float) -> float:
    """The probability that a fault striking each step independently with probability ``rate`` strikes at
    least one of ``steps`` steps: ``1 − (1 − rate)^steps`` (binomial, P[X ≥ 1] for X ~ Bin(steps, rate))."""
    if steps < 0 or not 0 <= rate <= 1:
        raise ValueError(f"steps must be ≥ 0 and rate in [0, 1], got {steps!r}, {rate!r}")
    return float(-math.expm1(steps * math.log1p(-rate))) if rate < 1 else (1.0 if steps else 0.0)


def rate_seen(steps: int, power: float = 0.95) -> float:
    """The smallest per-step fault rate that ``steps`` steps see with probability ``power``:
    ``1 − (1 − power)^(1/steps)`` (the inverse of :func:`seen_probability`)."""
    if steps < 1 or not 0 < power < 1:
        raise ValueError(f"steps must be ≥ 1 and power in (0, 1), got {steps!r}, {power!r}")
    return float(-math.expm1(math.log1p(-power) / steps))


def repeats_for(rate: float, steps_per_run: int, power: float = 0.95) -> int:
    """Repeats per worker for a fault of per-step ``rate`` to be seen with probability ``power``: the
    smallest R with ``1 − (1 − rate)^(R · steps_per_run) ≥ power``."""
    if not 0 < rate < 1 or steps_per_run < 1 or not 0 < power < 1:
        raise ValueError(f"rate and power must be in (0, 1) and steps_per_run ≥ 1, got {rate!r}, "
                         f"{steps_per_run!r}, {power!r}")
    steps = math.log1p(-power) / math.log1p(-rate)
    repeats = max(1, math.ceil(steps / steps_per_run - 1e-9))
    while seen_probability(repeats * steps_per_run, rate) < power:
        repeats += 1
    return repeats
