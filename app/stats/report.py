"""The whole study report, built from plain inputs by one pure function.

``build_report`` turns a sequence of ``RunData`` and ``MetricSpec`` into a frozen
``StudyReport``; ``compute_bands`` gives the per-step bands behind the ``/bands`` route.
``StudyReport.to_dict()`` and ``GroupBand.to_dict()`` return JSON-safe plain data: numpy
scalars become Python numbers, arrays become lists, **NaN becomes None and ±Inf become the
strings "inf" / "-inf"**.
"""
from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.stats.align import align_series
from app.stats import expectations, guarantees
from app.stats.bands import DEFAULT_QUANTILES, Band, compute_band, out_of_band_curves
from app.stats.cost import cost_ratio
from app.stats.downsample import extreme_indices
from app.stats.portability import Portability, adjust, band_containment, compare_stacks
from app.stats.repeatability import VERDICT_ORDER, RepeatRun, repeatability
from app.stats.seed_stability import seed_spread
from app.stats.sequential import sequential_seed_decision
from app.stats.stack_pairs import stack_pairs
from app.stats.variance import variance_components

__all__ = ["RunData", "MetricSpec", "Verdict", "StudyReport", "GroupBand", "build_report", "compute_bands",
           "to_plain", "STEP_TIME_KEY", "DETERMINISM_LEVELS", "Finals", "common_finals", "SeedStages"]

STEP_TIME_KEY = "step_time"
DETERMINISM_LEVELS = ("none", "seeded", "strict")
_COST_PAIRS = (("strict", "seeded"), ("seeded", "none"), ("strict", "none"))


@dataclass(frozen=True)
class RunData:
    """One run as the stats core sees it. ``series`` maps a metric key to (steps int64, values float64)."""

    run_id: int
    seed: int
    repeat: int
    determinism: str
    stack: str
    fingerprint: Mapping = field(default_factory=dict)
    digests: Mapping = field(default_factory=dict)
    status: str = "succeeded"
    series: Mapping = field(default_factory=dict)
    worker: int | str | None = None  # who ran it (pairs the cost comparison when one worker ran both runs)
    dtypes: Mapping = field(default_factory=dict)  # metric key -> logged value type ("float32"…); absent: float64


@dataclass(frozen=True)
class MetricSpec:
    """A metric to judge: repeatability tolerance (atol, rtol), seed-spread limit, stack margin."""

    name: str
    atol: float = 0.0
    rtol: float = 0.0
    max_std: float | None = None
    margin: float | None = None


@dataclass(frozen=True)
class SeedStages:
    """An adaptive study's stages: seed-stability verdicts are then group-sequential
    (``app.stats.sequential.sequential_seed_decision``). ``stage_of_seed`` maps each seed to the
    stage that added it (1-based); ``last_stage`` is the last stage the budget allows."""

    stage_of_seed: Mapping
    last_stage: int
    max_seeds: int
    spending: str = "pocock"

    @property
    def current(self) -> int:
        return max(self.stage_of_seed.values(), default=1)


@dataclass(frozen=True)
class Verdict:
    level: str  # repeatability | seed_stability | stack_portability
    metric: str
    group: Mapping
    verdict: str
    n_runs: int
    reason: str
    details: Mapping  # the numbers behind the verdict (plain data after to_dict)


@dataclass(frozen=True)
class StudyReport:
    verdicts: tuple
    variance_by_source: tuple
    determinism_cost: tuple
    diverged: tuple
    options: Mapping
    headline: tuple = ()  # expectations.LevelHeadline per determinism level (repeatability)
    # The full-resolution seed band (GroupBand) of every (metric, group) behind the seed-stability
    # verdicts, for consumers that draw it; not part of ``to_dict``.
    bands: tuple = ()

    def to_dict(self) -> dict:
        """JSON-safe plain data (NaN → None, ±Inf → "inf"/"-inf")."""
        out = {
            "headline": to_plain(self.headline),
            "verdicts": [],
            "variance_by_source": to_plain(self.variance_by_source),
            "determinism_cost": to_plain(self.determinism_cost),
            "diverged": to_plain(self.diverged),
            "options": to_plain(self.options),
        }
        for v in self.verdicts:
            entry = {"level": v.level, "metric": v.metric, "group": to_plain(v.group), "verdict": v.verdict,
                     "n_runs": int(v.n_runs), "reason": v.reason}
            entry.update(to_plain(v.details))
            out["verdicts"].append(entry)
        return out


def to_plain(obj):
    """Recursively convert dataclasses, mappings, sequences, numpy values to JSON-safe data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return _array_plain(obj)
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        if math.isnan(x):
            return None
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if obj is None or isinstance(obj, str):
        return obj
    return str(obj)


_NONFINITE = {True: "inf", False: "-inf"}


def _array_plain(arr: np.ndarray) -> list:
    """``to_plain`` of an array, whole rows at a time: ``tolist()`` gives exactly the Python
    numbers the per-element path gives, and only the non-finite cells are patched (NaN → None,
    ±Inf → "inf"/"-inf")."""
    if arr.ndim == 0 or arr.dtype.kind not in "biuf":
        return [to_plain(v) for v in arr.tolist()]  # object, complex, strings…: element by element
    if arr.ndim > 1:
        return [_array_plain(row) for row in arr]
    out = arr.tolist()
    if arr.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr))
        for i in bad.tolist():
            x = out[i]
            out[i] = None if x != x else _NONFINITE[x > 0]
    return out


# --------------------------------------------------------------------------- validation


def _validate(runs: Sequence[RunData], metrics: Sequence[MetricSpec] | None = None) -> list[RunData]:
    runs = list(runs)
    ids = set()
    for r in runs:
        if not isinstance(r, RunData):
            raise ValueError(f"runs must be RunData, got {type(r).__name__}")
        if r.determinism not in DETERMINISM_LEVELS:
            raise ValueError(f"run {r.run_id}: determinism must be one of {DETERMINISM_LEVELS}, got {r.determinism!r}")
        if r.run_id in ids:
            raise ValueError(f"duplicate run_id {r.run_id}")
        ids.add(r.run_id)
        for key, sv in r.series.items():
            if len(sv) != 2:
                raise ValueError(f"run {r.run_id} series {key!r} must be a (steps, values) pair")
    if metrics is not None:
        names = [m.name for m in metrics]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate metric names in {names}")
        for m in metrics:
            if m.atol < 0 or m.rtol < 0:
                raise ValueError(f"metric {m.name!r}: atol and rtol must be >= 0")
            if m.max_std is not None and not m.max_std > 0:
                raise ValueError(f"metric {m.name!r}: max_std must be > 0")
            if m.margin is not None and not m.margin > 0:
                raise ValueError(f"metric {m.name!r}: margin must be > 0")
    return runs


def _groups(runs: Sequence[RunData]) -> dict[tuple[str, str], list[RunData]]:
    out: dict[tuple[str, str], list[RunData]] = defaultdict(list)
    for r in runs:
        out[(r.determinism, r.stack)].append(r)
    return dict(sorted(out.items(), key=lambda kv: (DETERMINISM_LEVELS.index(kv[0][0]), kv[0][1])))


def _with_metric(runs: Sequence[RunData], metric: str) -> list[RunData]:
    return [r for r in runs if metric in r.series]


def _one_per_seed(runs: Sequence[RunData], metric: str) -> list[RunData]:
    """Among runs that logged ``metric``: the lowest repeat (then run_id) per seed, by seed."""
    best: dict[int, RunData] = {}
    for r in _with_metric(runs, metric):
        cur = best.get(r.seed)
        if cur is None or (r.repeat, r.run_id) < (cur.repeat, cur.run_id):
            best[r.seed] = r
    return [best[s] for s in sorted(best)]


def _series(r: RunData, metric: str):
    sv = r.series.get(metric)
    if sv is None:
        return None
    steps, values = np.asarray(sv[0]), np.asarray(sv[1], dtype=np.float64)
    return steps, values


def _final(r: RunData, metric: str) -> tuple[float | None, int | None]:
    """(value at the last logged step, first non-finite step or None); (None, None) if absent."""
    sv = _series(r, metric)
    if sv is None or sv[1].size == 0:
        return None, None
    steps, values = sv
    bad = ~np.isfinite(values)
    div = int(steps[int(np.argmax(bad))]) if bad.any() else None
    return float(values[-1]), div


# --------------------------------------------------------------------------- bands


@dataclass(frozen=True)
class GroupBand:
    group: Mapping
    metric: str
    run_ids: tuple  # runs used (one per seed)
    excluded_run_ids: tuple  # diverged runs left out of the band
    one_run_per_seed: bool  # True when repeats existed and only the first repeat was used
    downsampled: bool
    band: Band

    def to_dict(self) -> dict:
        b = self.band
        return to_plain({
            "group": self.group, "metric": self.metric, "run_ids": self.run_ids,
            "excluded_run_ids": self.excluded_run_ids, "one_run_per_seed": self.one_run_per_seed,
            "downsampled": self.downsampled, "coverage": b.coverage, "confidence": b.confidence,
            "steps": b.steps, "n": b.n, "mean": b.mean, "std": b.std, "min": b.min, "max": b.max,
            "quantiles": {f"{q:g}": b.quantiles[i] for i, q in enumerate(b.quantile_levels)},
            "ci_low": b.ci_low, "ci_high": b.ci_high, "ti_low": b.ti_low, "ti_high": b.ti_high,
        })


def _group_band(group_runs, metric, *, coverage, confidence, quantiles):
    chosen = _one_per_seed(group_runs, metric)
    aligned = align_series({r.run_id: _series(r, metric) for r in chosen})
    band = compute_band(aligned.values, steps=aligned.steps, coverage=coverage, confidence=confidence,
                        quantiles=quantiles, diverged=aligned.diverged)
    return chosen, aligned, band


def compute_bands(runs: Sequence[RunData], *, metric: str, coverage: float = 0.9, confidence: float = 0.95,
                  quantiles=DEFAULT_QUANTILES, max_points: int | None = None) -> tuple:
    """Per-step seed bands of ``metric`` for every (determinism, stack) group.

    One run per seed (the lowest repeat) enters the band, diverged runs (a non-finite value
    anywhere) are excluded and listed. Statistics per step as in ``app.stats.bands.compute_band``;
    with ``max_points`` the steps are decimated keeping each bucket's min of the band minimum
    and max of the band maximum (``app.stats.downsample.extreme_indices``).
    """
    runs = _validate(runs)
    if max_points is not None and (int(max_points) != max_points or max_points < 2):
        raise ValueError(f"max_points must be an integer >= 2, got {max_points!r}")
    out = []
    for (det, stack), group_runs in _groups(runs).items():
        chosen, aligned, band = _group_band(group_runs, metric, coverage=coverage, confidence=confidence,
                                            quantiles=quantiles)
        if not chosen:
            continue
        down = False
        if max_points is not None and band.steps.size > max_points:
            down = True
            band = band.take(extreme_indices(band.min, band.max, max_points=int(max_points)))
        ids = tuple(int(r.run_id) for r in chosen)
        out.append(GroupBand(group={"determinism": det, "stack": stack}, metric=metric,
                             run_ids=tuple(i for i, d in zip(ids, aligned.diverged) if not d),
                             excluded_run_ids=tuple(i for i, d in zip(ids, aligned.diverged) if d),
                             one_run_per_seed=len(chosen) < len(_with_metric(group_runs, metric)), downsampled=down, band=band))
    return tuple(out)


# --------------------------------------------------------------------------- report


def _repeatability_verdicts(groups, spec: MetricSpec) -> list[Verdict]:
    out = []
    for (det, stack), group_runs in groups.items():
        by_seed: dict[int, list[RunData]] = defaultdict(list)
        for r in group_runs:
            if spec.name in r.series:
                by_seed[r.seed].append(r)
        if not by_seed:
            continue
        per_seed = {}
        for seed in sorted(by_seed):
            rs = sorted(by_seed[seed], key=lambda r: (r.repeat, r.run_id))
            per_seed[seed] = (rs, repeatability([_repeat_run(r, spec.name) for r in rs], atol=spec.atol,
                                                rtol=spec.rtol, determinism=det))
        conclusive = {s: v for s, v in per_seed.items() if v[1].verdict in VERDICT_ORDER}
        n_runs = sum(len(v[0]) for v in per_seed.values())
        if not conclusive:
            verdict = "inconclusive"
            reason = f"{det} runs: no seed has 2 or more repeats ({len(per_seed)} seed(s)); need at least 2"
            worst_seed = None
        else:
            worst_seed = max(conclusive, key=lambda s: (VERDICT_ORDER[conclusive[s][1].verdict],
                                                        conclusive[s][1].max_abs_delta, -s))
            w = conclusive[worst_seed][1]
            verdict = w.verdict
            if verdict == "identical":
                if len(conclusive) == 1:
                    reason = f"{det} runs of seed {worst_seed} bitwise identical across {w.n_runs} repeats"
                else:
                    reason = f"{det} runs bitwise identical across repeats for all {len(conclusive)} seeds"
            else:
                reason = f"seed {worst_seed} (worst of {len(conclusive)}): {w.reason}"
        detail = [{"seed": s, "run_ids": [r.run_id for r in rs], **to_plain(res)} for s, (rs, res) in per_seed.items()]
        firsts = [rs[0] for rs, _ in per_seed.values()]
        seeds_identical = _all_identical(firsts, spec.name) if len(firsts) >= 2 else None
        exp = expectations.repeatability_expectation(
            det, verdict, source=conclusive[worst_seed][1].source if worst_seed is not None else None,
            seeds_identical=seeds_identical,
            deltas_finite=all(np.isfinite(res.max_abs_delta) for _, res in conclusive.values()))
        numbers = {}
        if worst_seed is not None:
            w = conclusive[worst_seed][1]
            numbers = {"worst_seed": worst_seed, "max_abs_delta": max(v[1].max_abs_delta for v in conclusive.values()),
                       "max_rel_delta": max(v[1].max_rel_delta for v in conclusive.values()),
                       "max_ulps": max(v[1].max_ulps for v in conclusive.values()),
                       "first_divergent_step": w.first_divergent_step, "source": w.source,
                       "data_order_epoch": w.data_order_epoch}
        out.append(Verdict("repeatability", spec.name, {"determinism": det, "stack": stack}, verdict, n_runs, reason,
                           {**numbers, "atol": spec.atol, "rtol": spec.rtol, "per_seed": detail,
                            "dtype": _dtype(group_runs, spec.name),
                            "seeds_identical": seeds_identical, "n_seeds_compared": len(firsts),
                            "expected": exp.expected, "met_expectation": exp.met, "expectation": exp.phrase,
                            "suspicious": list(exp.suspicious),
                            "guarantee": guarantees.repeatability()}))
    return out


def _dtype(runs: Sequence[RunData], metric: str) -> str:
    found = {str(r.dtypes[metric]) for r in runs if metric in r.series and r.dtypes.get(metric) is not None}
    return found.pop() if len(found) == 1 else "float64"


def _repeat_run(r: RunData, metric: str) -> RepeatRun:
    steps, values = _series(r, metric)
    return RepeatRun(steps=steps, values=values, fingerprint=r.fingerprint,
                     initial_weights=r.digests.get("initial_weights"),
                     data_order=tuple(r.digests.get("data_order") or ()),
                     other_digests={k: r.digests.get(k) for k in ("final_weights", "optimizer_state")},
                     dtype=r.dtypes.get(metric))


def _all_identical(runs: Sequence[RunData], metric: str) -> bool:
    """True when every run's series of ``metric`` has the same steps and bitwise the same values."""
    ref_steps, ref_values = _series(runs[0], metric)
    for r in runs[1:]:
        steps, values = _series(r, metric)
        if not (np.array_equal(steps, ref_steps) and values.shape == ref_values.shape
                and np.array_equal(values.view(np.int64), ref_values.view(np.int64))):
            return False
    return ref_values.size > 0


@dataclass(frozen=True)
class Finals:
    """Final values of a set of runs, read at the last step every non-diverged run logged.

    ``step`` is that common step (None when the runs share no logged step); ``short_run_ids``
    are runs (not diverged) that stopped before the longest one — their final value is read at
    ``step`` like every other run's, and they are reported; ``diverged_run_ids`` are runs whose
    metric turned non-finite (they have no final value and count against stability)."""

    values: np.ndarray
    run_ids: list
    diverged_run_ids: list
    step: int | None
    short_run_ids: list


def common_finals(runs: Sequence[RunData], metric: str) -> Finals:
    """Each run's value at the common final step (see ``Finals``); runs without the metric are skipped."""
    ok: list[tuple[RunData, tuple[np.ndarray, np.ndarray]]] = []
    bad: list[tuple[RunData, tuple[np.ndarray, np.ndarray]]] = []
    for r in runs:
        sv = _series(r, metric)
        if sv is None or sv[1].size == 0:
            continue
        (bad if not np.all(np.isfinite(sv[1])) else ok).append((r, sv))
    if not ok:
        return Finals(np.zeros(0), [], [r.run_id for r, _ in bad], None, [])
    common = ok[0][1][0]
    for _, (steps, _) in ok[1:]:
        if steps is common or (steps.shape == common.shape and np.array_equal(steps, common)):
            continue  # the usual case, runs on one step grid: no sort
        common = np.intersect1d(common, steps, assume_unique=True)
    if common.size == 0:
        return Finals(np.zeros(0), [], [r.run_id for r, _ in bad], None, [])
    step = int(common[-1])
    longest = max(int(steps[-1]) for _, (steps, _) in ok)
    vals = [float(values[int(np.searchsorted(steps, step))]) for _, (steps, values) in ok]
    return Finals(np.array(vals, dtype=np.float64), [r.run_id for r, _ in ok], [r.run_id for r, _ in bad], step,
                  [r.run_id for r, (steps, _) in ok if int(steps[-1]) < longest])


_SPENDING_NAMES = {"pocock": "Pocock-type", "obrien_fleming": "O'Brien–Fleming-type"}


def _sequential(chosen, fin: Finals, max_std: float, stages: SeedStages, *, alpha: float):
    seed_of = {r.run_id: r.seed for r in chosen}
    by_stage: list[list[float]] = [[] for _ in range(stages.current)]
    for v, i in zip(fin.values, fin.run_ids):
        by_stage[int(stages.stage_of_seed.get(seed_of[i], 1)) - 1].append(v)
    return sequential_seed_decision(by_stage, max_std=max_std, max_seeds=stages.max_seeds,
                                    last_stage=stages.last_stage, alpha=alpha, spending=stages.spending)


def _sequential_reason(d, stages: SeedStages, alpha: float) -> str:
    head = (f"group-sequential over {len(d.stages)} stage(s) of at most {stages.last_stage} "
            f"({_SPENDING_NAMES.get(stages.spending, stages.spending)} alpha spending, each claim ≤ {alpha:g} over all stages)")
    if not d.stages:
        return head + ": no stage had a final value"
    look = d.stages[-1]  # the test stops at the look that decides
    bounds = "" if look.upper is None else f", σ bounds [{look.lower:.3g}, {look.upper:.3g}]"
    what = {"stable": "stable", "unstable": "unstable"}.get(d.verdict)
    if what:
        return (f"{head}: {what} at stage {look.stage} with {look.n_seeds} seeds (boundary z {look.boundary:.3f}, "
                f"nominal level {look.nominal_alpha:.3g}{bounds})")
    tail = "budget spent" if d.final else "more seeds come in the next stage"
    return (f"{head}: inconclusive at stage {look.stage} with {look.n_seeds} seeds (boundary z "
            f"{look.boundary:.3f}{bounds}); {tail}")


def _seed_verdicts(groups, spec: MetricSpec, *, coverage, confidence, alpha, false_alarm,
                   stages: SeedStages | None = None, bands: list | None = None) -> list[Verdict]:
    out = []
    for (det, stack), group_runs in groups.items():
        chosen, aligned, band = _group_band(group_runs, spec.name, coverage=coverage, confidence=confidence,
                                            quantiles=DEFAULT_QUANTILES)
        if not chosen:
            continue
        fin = common_finals(chosen, spec.name)
        values, ids, bad = fin.values, fin.run_ids, fin.diverged_run_ids
        spread = seed_spread(values, max_std=spec.max_std, coverage=coverage, confidence=confidence, alpha=alpha,
                             n_diverged=len(bad))
        reason = spread.reason
        verdict, sequential = spread.verdict, None
        if stages is not None and spec.max_std is not None and not bad and fin.step is not None:
            sequential = _sequential(chosen, fin, spec.max_std, stages, alpha=alpha)
            verdict = sequential.verdict
            reason = (_sequential_reason(sequential, stages, alpha)
                      + f"; for reference, the fixed-sample rule on all {spread.n} seeds: {spread.reason}")
        if fin.step is not None:
            reason += f"; final values at step {fin.step}"
            if fin.short_run_ids:
                reason += f" (the last step all runs reached; run(s) {', '.join(map(str, fin.short_run_ids))} stopped early)"
        elif ids == [] and len(bad) == 0:
            reason += "; the runs share no logged step"
        if bad:
            reason += f"; diverged run(s) {', '.join(map(str, bad))} excluded from the band"
        per_seed = len(chosen) < len(_with_metric(group_runs, spec.name))
        if per_seed:
            reason += "; one run per seed (first repeat)"
        if bands is not None:  # the same GroupBand as compute_bands gives for this group
            chosen_ids = [int(r.run_id) for r in chosen]
            bands.append(GroupBand(group={"determinism": det, "stack": stack}, metric=spec.name,
                                   run_ids=tuple(i for i, d in zip(chosen_ids, aligned.diverged) if not d),
                                   excluded_run_ids=tuple(i for i, d in zip(chosen_ids, aligned.diverged) if d),
                                   one_run_per_seed=per_seed, downsampled=False, band=band))
        flagged = []
        oob_info = None
        keep = ~aligned.diverged
        if keep.sum() >= 3:
            oob = out_of_band_curves(aligned.values if keep.all() else aligned.values[keep], false_alarm=false_alarm)
            kept_ids = [r.run_id for r, k in zip(chosen, keep) if k]
            flagged = [i for i, f in zip(kept_ids, oob.flagged) if f]
            oob_info = {"run_ids": kept_ids, "testable": oob.testable, "level_score": oob.level_score,
                        "statistic": oob.statistic, "df": oob.df, "p_value": oob.p_value,
                        "p_adjusted": oob.p_adjusted, "steps_used": oob.steps_used, "false_alarm": oob.false_alarm,
                        "exact": oob.exact, "method": oob.method, "reason": oob.reason,
                        "guarantee": guarantees.out_of_band(false_alarm)}
            if flagged:
                reason += (f"; out of band: run(s) {', '.join(map(str, flagged))} "
                           f"(whole curve vs the other runs, false alarm ≤ {false_alarm:g} per study)")
        out.append(Verdict("seed_stability", spec.name, {"determinism": det, "stack": stack}, verdict,
                           len(chosen), reason,
                           {"spread": spread, "final_values": values, "final_run_ids": ids, "diverged_run_ids": bad,
                            "final_step": fin.step, "short_run_ids": fin.short_run_ids,
                            "one_run_per_seed": per_seed, "n_needed": spread.n_needed,
                            "out_of_band": flagged, "out_of_band_test": oob_info,
                            "sequential": sequential,
                            "guarantee": guarantees.seed_stability(alpha, sequential=sequential is not None)}))
    return out


def _portability_verdicts(groups, spec: MetricSpec, *, reference_stack, alpha, rng, coverage, confidence):
    pending: list[tuple[dict[str, Any], Portability | None, dict[str, Any]]] = []
    by_level: dict[str, dict[str, list[RunData]]] = defaultdict(dict)
    for (det, stack), rs in groups.items():
        by_level[det][stack] = rs
    for det, stacks in by_level.items():
        if len(stacks) < 2:
            continue
        order = list(stacks)
        ref = reference_stack if reference_stack is not None else min(
            order, key=lambda s: min(r.run_id for r in stacks[s]))
        if ref not in stacks:
            continue
        _, _, ref_band = _group_band(stacks[ref], spec.name, coverage=coverage, confidence=confidence, quantiles=(0.5,))
        ref_runs = _one_per_seed(stacks[ref], spec.name)
        for cand in order:
            if cand == ref:
                continue
            _, _, cand_band = _group_band(stacks[cand], spec.name, coverage=coverage, confidence=confidence,
                                          quantiles=(0.5,))
            cand_runs = _one_per_seed(stacks[cand], spec.name)
            both = common_finals(ref_runs + cand_runs, spec.name)  # one common final step for both stacks
            ref_ids = {r.run_id for r in ref_runs}
            ref_vals = np.array([v for v, i in zip(both.values, both.run_ids) if i in ref_ids])
            cand_vals = np.array([v for v, i in zip(both.values, both.run_ids) if i not in ref_ids])
            ref_bad = [i for i in both.diverged_run_ids if i in ref_ids]
            cand_bad = [i for i in both.diverged_run_ids if i not in ref_ids]
            group = {"determinism": det, "reference_stack": ref, "candidate_stack": cand}
            common, ia, ib = np.intersect1d(ref_band.steps, cand_band.steps, return_indices=True)
            share, k = band_containment(cand_band.mean[ib], ref_band.ti_low[ia], ref_band.ti_high[ia]) \
                if common.size else (float("nan"), 0)
            base = {"n_reference": ref_vals.size, "n_candidate": cand_vals.size,
                    "diverged_run_ids": ref_bad + cand_bad, "band_containment": share, "band_steps_compared": k,
                    "margin": spec.margin, "final_step": both.step, "short_run_ids": both.short_run_ids,
                    "same_seed": _same_seed(stacks[ref], stacks[cand], spec)}
            if ref_vals.size < 2 or cand_vals.size < 2:
                pending.append((group, None, base))
            else:
                pending.append((group, compare_stacks(ref_vals, cand_vals, margin=spec.margin, rng=rng, alpha=alpha),
                                base))
    return pending


def build_report(runs: Sequence[RunData], metrics: Sequence[MetricSpec], *, coverage: float = 0.9,
                 confidence: float = 0.95, alpha: float = 0.05, reference_stack: str | None = None,
                 rng: np.random.Generator, adjust_method: str = "holm", false_alarm: float = 0.01,
                 cost_budget: float | None = None, stages: SeedStages | None = None) -> StudyReport:
    """Build the study report: the three verdict levels, variance by source, cost, divergences.

    Groups are (determinism, stack).
    * repeatability — per seed, repeats compared against the lowest repeat
      (``app.stats.repeatability``); one verdict per (metric, group) = the worst seed;
      ``inconclusive`` when no seed has two repeats.
    * seed_stability — one run per seed (lowest repeat); final value = each run's value at the
      last step that every non-diverged run of the group logged (``Finals``; runs that stopped
      early are listed); diverged runs have no final value, are excluded from the band and count
      against stability (``unstable``); verdict of ``app.stats.seed_stability.seed_spread``
      (robust σ bounds); out-of-band runs by the whole-curve leave-one-out test
      ``app.stats.bands.out_of_band_curves`` (familywise level ``false_alarm`` per group).
      Every verdict carries ``guarantee``, its false-alarm level in one phrase.
    * stack_portability — per determinism level, every other stack against ``reference_stack``,
      final values at one common step of both stacks
      (default: the stack of the lowest run id). TOST and Welch p-values are adjusted over all
      comparisons of the report with ``adjust_method`` ("holm" or "bh"). Rule: with a margin,
      ``equivalent`` if adjusted TOST p < α; ``not_equivalent`` if the (1 − α) Welch CI of the
      difference lies entirely outside [−margin, margin]; else ``inconclusive`` with the seeds
      per stack needed. Without a margin equivalence cannot be claimed: ``not_equivalent`` if
      the adjusted Welch p < α, else ``inconclusive``.
      Seeds run on both stacks are also compared step by step (``same_seed``,
      ``app.stats.stack_pairs``): the named source (``stack`` when fingerprints differ), the
      first divergent step and the size of the difference.
    ``stages`` (an adaptive study): seed-stability verdicts with a ``max_std`` are judged
      group-sequentially over the stages (``SeedStages``; details carry ``sequential``).
    ``rng`` drives every bootstrap (portability CI). ``cost_budget``: the largest acceptable
    step-time ratio between determinism levels; the cost entries then carry a
    ``pass``/``fail``/``inconclusive`` verdict (``app.stats.cost``).
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator")
    for name, v in (("coverage", coverage), ("confidence", confidence), ("alpha", alpha),
                    ("false_alarm", false_alarm)):
        if not (0 < v < 1):
            raise ValueError(f"{name} must be strictly between 0 and 1, got {v!r}")
    runs = _validate(runs, metrics)
    groups = _groups(runs)
    verdicts: list[Verdict] = []
    bands: list[GroupBand] = []
    pending_port = []
    for spec in metrics:
        verdicts += _repeatability_verdicts(groups, spec)
        verdicts += _seed_verdicts(groups, spec, coverage=coverage, confidence=confidence, alpha=alpha,
                                   false_alarm=false_alarm, stages=stages, bands=bands)
        pending_port += [(spec, *p) for p in _portability_verdicts(groups, spec, reference_stack=reference_stack,
                                                                   alpha=alpha, rng=rng, coverage=coverage,
                                                                   confidence=confidence)]
    verdicts += _finish_portability(pending_port, alpha=alpha, method=adjust_method)
    diverged = []
    for r in runs:
        for key in sorted(r.series):
            _, div = _final(r, key)
            if div is not None and key != STEP_TIME_KEY:
                diverged.append({"run_id": r.run_id, "metric": key, "step": div, "determinism": r.determinism,
                                 "stack": r.stack, "seed": r.seed})
    options = {"coverage": coverage, "confidence": confidence, "alpha": alpha, "reference_stack": reference_stack,
               "adjust_method": adjust_method, "false_alarm": false_alarm,
               "sequential": None if stages is None else {"last_stage": stages.last_stage, "max_seeds": stages.max_seeds,
                                                          "spending": stages.spending, "stage": stages.current},
               "nonfinite_encoding": "NaN -> null, +/-Inf -> 'inf'/'-inf'"}
    head = expectations.headline(
        {"group": v.group, "met_expectation": v.details["met_expectation"], "expectation": v.details["expectation"],
         "suspicious": v.details["suspicious"]} for v in verdicts if v.level == "repeatability")
    return StudyReport(verdicts=tuple(verdicts), variance_by_source=tuple(_variance(groups, metrics)),
                       determinism_cost=tuple(_cost(runs, confidence=confidence, budget=cost_budget)),
                       diverged=tuple(diverged), options=options, headline=head, bands=tuple(bands))


def _finish_portability(pending, *, alpha, method) -> list[Verdict]:
    tost_idx = [i for i, (_, _, res, _) in enumerate(pending) if res is not None and res.tost is not None]
    welch_idx = [i for i, (_, _, res, _) in enumerate(pending) if res is not None]
    tost_adj = dict(zip(tost_idx, adjust([pending[i][2].tost.p_value for i in tost_idx], method=method))) \
        if tost_idx else {}
    welch_adj = dict(zip(welch_idx, adjust([pending[i][2].welch.p_value for i in welch_idx], method=method))) \
        if welch_idx else {}
    out = []
    for i, (spec, group, res, base) in enumerate(pending):
        n_runs = base["n_reference"] + base["n_candidate"]
        details = {**base, "adjust_method": method, "n_comparisons_tost": len(tost_idx),
                   "n_comparisons_welch": len(welch_idx), "guarantee": guarantees.stack_portability(alpha, method)}
        if res is None:
            out.append(Verdict("stack_portability", spec.name, group, "inconclusive", n_runs,
                               f"need at least 2 finite runs per stack (reference {base['n_reference']}, "
                               f"candidate {base['n_candidate']})", {**details, "n_needed": 2}))
            continue
        details.update({"result": res, "tost_p_adjusted": tost_adj.get(i), "welch_p_adjusted": welch_adj.get(i),
                        "n_needed": res.n_needed})
        m = spec.margin
        d = f"Δmean {res.diff:.3g} (CI {res.diff_ci_low:.3g}..{res.diff_ci_high:.3g})"
        if res.tost is not None and res.tost.exact:
            exact = f"both stacks' final values constant: Δmean {res.diff:.3g} exactly"
            if abs(res.diff) < m:
                verdict, reason = "equivalent", f"{exact}, within ±{m:g} (exact, zero variance)"
            elif abs(res.diff) > m:
                verdict, reason = "not_equivalent", f"{exact}, outside ±{m:g} (exact, zero variance)"
            else:
                verdict, reason = "inconclusive", f"{exact}, on the margin ±{m:g}"
        elif m is not None:
            if tost_adj[i] < alpha:
                verdict, reason = "equivalent", f"{d} within ±{m:g}: TOST p={tost_adj[i]:.3g} ({method})"
            elif res.diff_ci_low > m or res.diff_ci_high < -m:
                verdict, reason = "not_equivalent", f"{d} entirely outside ±{m:g}"
            else:
                verdict = "inconclusive"
                reason = f"{d}, TOST p={tost_adj[i]:.3g} ({method}) ≥ {alpha:g}" + (
                    "; indistinguishable from the margin at this precision" if
                    res.diff_ci_low <= m <= res.diff_ci_high or res.diff_ci_low <= -m <= res.diff_ci_high else "") + (
                    f"; {res.plan}" if res.plan else "")
        else:
            if welch_adj[i] < alpha:
                verdict, reason = "not_equivalent", f"no margin given; {d}, Welch p={welch_adj[i]:.3g} ({method})"
            else:
                verdict, reason = "inconclusive", f"no margin given, equivalence cannot be claimed; {d}"
        if base["diverged_run_ids"]:
            reason += f"; {len(base['diverged_run_ids'])} diverged run(s) excluded"
        reason += _same_seed_phrase(base["same_seed"])
        out.append(Verdict("stack_portability", spec.name, group, verdict, n_runs, reason, details))
    return out


def _variance(groups, metrics) -> list[dict]:
    out = []
    for spec in metrics:
        for (det, stack), group_runs in groups.items():
            by_seed: dict[int, list[float]] = defaultdict(list)
            fin = common_finals(group_runs, spec.name)  # every run's value at the group's common final step
            seed_of = {r.run_id: r.seed for r in group_runs}
            for rid, v in zip(fin.run_ids, fin.values):
                by_seed[seed_of[rid]].append(float(v))
            entry = {"metric": spec.name, "group": {"determinism": det, "stack": stack},
                     "n_seeds": len(by_seed), "n_runs": sum(map(len, by_seed.values())), "final_step": fin.step}
            if len(by_seed) >= 2 and any(len(v) >= 2 for v in by_seed.values()):
                vc = variance_components([by_seed[s] for s in sorted(by_seed)])
                entry.update({"available": True, "components": to_plain(vc),
                              "estimator": "one-way random-effects ANOVA (method of moments, n0 for unbalanced)"})
                if det == "none":
                    # Seeds are not applied at `none`: seed labels are arbitrary, there is no
                    # between-seed component, only run-to-run variation.
                    entry.update({"between_seed_applies": False,
                                  "note": "seeds are not applied at 'none': all variance is run to run; "
                                          "the between-seed split does not apply"})
                else:
                    entry["between_seed_applies"] = True
            elif by_seed:
                entry.update({"available": False, "reason": "need at least 2 seeds and a seed with 2+ repeats"})
            else:
                continue
            out.append(entry)
    return out


def _cost(runs, *, confidence, budget=None) -> list[dict]:
    """Step-time ratio per stack for each pair of determinism levels (``app.stats.cost.cost_ratio``).

    Runs are paired by (seed, repeat) — adjacent in the queue (``balanced_level_order``) — when
    each (seed, repeat) has one run per level and both runs of every pair ran on the same worker
    (``RunData.worker``); otherwise the levels are compared as independent samples (Welch).
    ``budget``: the largest acceptable ratio for every pair, judged ``pass``/``fail``/``inconclusive``.
    """
    times: dict[str, dict[str, list[tuple]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        sv = _series(r, STEP_TIME_KEY)
        if sv is not None and np.isfinite(sv[1]).any():
            times[r.stack][r.determinism].append(((r.seed, r.repeat), sv[1], r.worker))
    out = []
    for stack in sorted(times):
        for num, den in _COST_PAIRS:
            if num in times[stack] and den in times[stack]:
                a = sorted(times[stack][num], key=lambda t: t[0])
                b = sorted(times[stack][den], key=lambda t: t[0])
                paired = (len(a) >= 2 and [k for k, _, _ in a] == [k for k, _, _ in b]
                          and len({k for k, _, _ in a}) == len(a)
                          and all(wa is not None and wa == wb for (_, _, wa), (_, _, wb) in zip(a, b)))
                cr = cost_ratio([t for _, t, _ in a], [t for _, t, _ in b], numerator=num, denominator=den,
                                confidence=confidence, paired=paired, budget=budget)
                out.append({"stack": stack, **to_plain(cr)})
    return out


def _same_seed(ref_runs, cand_runs, spec: MetricSpec):
    """Each seed run on both stacks (lowest repeat) compared step by step: the named source
    (``stack`` when the fingerprints differ), the first divergent step and the deltas."""
    def first(runs):
        return {r.seed: r for r in reversed(sorted(_with_metric(runs, spec.name), key=lambda r: (r.repeat, r.run_id)))}

    a, b = first(ref_runs), first(cand_runs)
    return stack_pairs({s: (_repeat_run(a[s], spec.name), _repeat_run(b[s], spec.name))
                        for s in sorted(a.keys() & b.keys())},
                       atol=spec.atol, rtol=spec.rtol)


def _same_seed_phrase(pairs) -> str:
    if pairs.n_pairs == 0:
        return ""
    if pairs.verdict == "identical":
        return f"; same seed on both stacks: bitwise identical ({pairs.n_pairs} seed(s))"
    return (f"; same seed on both stacks: source {pairs.source}, first divergence at step "
            f"{pairs.first_divergent_step}, max |Δ| {pairs.max_abs_delta:.3g} ({pairs.max_ulps} ULPs)")
