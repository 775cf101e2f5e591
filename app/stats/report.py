"""The whole study report, built from plain inputs by one pure function.

``build_report`` turns a sequence of ``RunData`` and ``MetricSpec`` into a frozen
``StudyReport``; ``compute_bands`` gives the per-step bands behind the ``/bands`` route.
The level builders live in ``steady.server.stats.report_levels``, the dataclasses and shared helpers in
``steady.server.stats.report_data``, plain-data conversion in ``steady.server.stats.serialize``.
``StudyReport.to_dict()`` and ``GroupBand.to_dict()`` return JSON-safe plain data: numpy
scalars become Python numbers, arrays become lists, **NaN and ±Inf become the strings "NaN",
"Infinity" and "-Infinity"** (the API's one spelling, ``steady.server.kit.wire``); None stays None ("absent").
``StudyReport.to_data()`` keeps non-finite floats as floats.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from steady.server.stats import expectations
from steady.server.stats.expectations import BUILTIN, SeedRoute
from steady.server.stats.cost import cost_guarantee, cost_ratio
from steady.server.stats.report_data import (
    STEP_TIME_KEY,
    STEP_TIME_SOURCES,
    Finals,
    GroupBand,
    MetricSpec,
    RunData,
    SeedStages,
    StudyReport,
    Verdict,
    _final,
    _groups,
    _series,
    _validate,
    common_finals,
    compute_bands,
    last_finals,
)
from steady.server.stats.report_levels import (
    _finish_portability,
    _portability_verdicts,
    _repeatability_verdicts,
    _seed_verdicts,
)
from steady.server.stats.serialize import to_data, to_plain
from steady.server.stats.variance import variance_components
from steady.server.stats.vocabulary import DETERMINISM_LEVELS

__all__ = ["RunData", "MetricSpec", "Verdict", "StudyReport", "GroupBand", "build_report", "compute_bands",
           "to_plain", "to_data", "STEP_TIME_KEY", "DETERMINISM_LEVELS", "Finals", "common_finals", "last_finals",
           "SeedStages", "COST_PAIRS"]

COST_PAIRS = (("strict", "seeded"), ("seeded", "none"), ("strict", "none"))


def build_report(runs: Sequence[RunData], metrics: Sequence[MetricSpec], *, coverage: float = 0.9,
                 confidence: float = 0.95, alpha: float = 0.05, reference_stack: str | None = None,
                 rng: np.random.Generator, adjust_method: str = "holm", false_alarm: float = 0.01,
                 cost_budget: float | None = None, stages: SeedStages | None = None,
                 route: SeedRoute = BUILTIN, cost_confidence: float | None = None) -> StudyReport:
    """Build the study report: the three verdict levels, variance by source, cost, divergences.

    Groups are (determinism, stack).
    * repeatability — per seed, repeats compared against the lowest repeat
      (``steady.server.stats.repeatability``); one verdict per (metric, group) = the worst seed;
      ``inconclusive`` when no seed has two repeats.
    * seed_stability — one run per seed (lowest repeat); final value = each run's last logged value,
      whatever its step (``last_finals``: early stopping and epochs of different length are normal; when
      the final steps differ, their spread is reported as ``final_step_spread``, and the per-step band
      compares the runs at the steps they share); diverged runs have no final value, are excluded from the band and count
      against stability (``unstable``); verdict of ``steady.server.stats.seed_stability.seed_spread``
      (robust σ bounds); out-of-band runs by the whole-curve leave-one-out test
      ``steady.server.stats.bands.out_of_band_curves`` (familywise level ``false_alarm`` per group).
      Every verdict carries ``guarantee``, its false-alarm level in one phrase.
    * stack_portability — per determinism level, every other stack against ``reference_stack``,
      each run's last logged value (as for seed stability)
      (default: the stack of the lowest run id). TOST and Welch p-values are adjusted over all
      comparisons of the report with ``adjust_method`` ("holm" or "bh"). Rule: with a margin,
      ``equivalent`` if adjusted TOST p < α; ``not_equivalent`` if the (1 − α) Welch CI of the
      difference lies entirely outside [−margin, margin]; else ``inconclusive`` with the seeds
      per stack needed. Without a margin equivalence cannot be claimed: ``not_equivalent`` if
      the adjusted Welch p < α, else ``inconclusive``.
      Seeds run on both stacks are also compared step by step (``same_seed``,
      ``steady.server.stats.stack_pairs``): the named source (``stack`` when fingerprints differ), the
      first divergent step and the size of the difference.
    ``stages`` (an adaptive study): seed-stability verdicts with a ``max_std`` are judged
      group-sequentially over the stages (``SeedStages``; details carry ``sequential``), and so
      are portability verdicts with a margin (``steady.server.stats.sequential_tost``).
    ``route``: who runs the code and whether it receives the seed itself (built-in, entrypoint,
      command with or without ``{seed}``): what ``none`` is expected to show
      (``steady.server.stats.expectations``) and whether runs of different seeds that are bitwise
      identical mean the seed has no effect (``seed_has_no_effect``, a failing seed-stability verdict).
    ``rng`` drives every bootstrap (portability CI). ``cost_budget``: the largest acceptable
    step-time ratio between determinism levels; the cost entries then carry a
    ``pass``/``fail``/``inconclusive`` verdict (``steady.server.stats.cost``), from the ratio's CI at
    ``cost_confidence`` (default ``confidence``; a study that sets its level α asks 1 − α).
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator")
    cost_confidence = confidence if cost_confidence is None else cost_confidence
    for name, v in (("coverage", coverage), ("confidence", confidence), ("alpha", alpha),
                    ("false_alarm", false_alarm), ("cost_confidence", cost_confidence)):
        if not (0 < v < 1):
            raise ValueError(f"{name} must be strictly between 0 and 1, got {v!r}")
    runs = _validate(runs, metrics)
    groups = _groups(runs)
    verdicts: list[Verdict] = []
    bands: list[GroupBand] = []
    pending_port = []
    for spec in metrics:
        verdicts += _repeatability_verdicts(groups, spec, route=route)
        verdicts += _seed_verdicts(groups, spec, coverage=coverage, confidence=confidence, alpha=alpha,
                                   false_alarm=false_alarm, stages=stages, bands=bands, route=route)
        pending_port += [(spec, *p) for p in _portability_verdicts(groups, spec, reference_stack=reference_stack,
                                                                   alpha=alpha, rng=rng, coverage=coverage,
                                                                   confidence=confidence, stages=stages)]
    verdicts += _finish_portability(pending_port, alpha=alpha, method=adjust_method, stages=stages)
    diverged = []
    for r in runs:
        for key in sorted(r.series):
            _, div = _final(r, key)
            if div is not None and key not in STEP_TIME_SOURCES:
                diverged.append({"run_id": r.run_id, "metric": key, "step": div, "determinism": r.determinism,
                                 "stack": r.stack, "seed": r.seed})
    options = {"coverage": coverage, "confidence": confidence, "alpha": alpha, "reference_stack": reference_stack,
               "adjust_method": adjust_method, "false_alarm": false_alarm,
               "sequential": None if stages is None else {"last_stage": stages.last_stage, "max_seeds": stages.max_seeds,
                                                          "spending": stages.spending, "stage": stages.current,
                                                          "stopped": stages.stopped},
               "nonfinite_encoding": "NaN, +/-Inf -> 'NaN', 'Infinity', '-Infinity'; null: absent"}
    head = expectations.headline(
        {"group": v.group, "expected": v.details["expected"], "met_expectation": v.details["met_expectation"],
         "expectation": v.details["expectation"],
         "suspicious": v.details["suspicious"]} for v in verdicts if v.level == "repeatability")
    cost = _cost(runs, confidence=cost_confidence, budget=cost_budget)
    return StudyReport(verdicts=tuple(verdicts), variance_by_source=tuple(_variance(groups, metrics, route)),
                       determinism_cost=tuple(cost), diverged=tuple(diverged), options=options, headline=head,
                       bands=tuple(bands), cost_note=None if cost else _cost_note(runs))


def _variance(groups, metrics, route: SeedRoute = BUILTIN) -> list[dict]:
    """Final-value variance between seeds against run to run, per (metric, group). The between-seed split
    applies where the seed reaches the code (``SeedRoute.reaches``, the same model the repeatability
    expectations and the seed-stability verdicts read): at ``seeded``/``strict``, and at ``none`` for code
    that receives the seed itself (a command with ``{seed}``, an entrypoint). Where it does not reach the
    code (a built-in or a command without ``{seed}`` at ``none``, an arm that pins every seed) the seed labels
    are arbitrary: every run is a repeat and all of the variance is run to run."""
    out = []
    for spec in metrics:
        for (det, stack), group_runs in groups.items():
            by_seed: dict[int, list[float]] = defaultdict(list)
            fin = last_finals(group_runs, spec.name)  # every run's last logged value, as seed stability judges
            seed_of = {r.run_id: r.seed for r in group_runs}
            for rid, v in zip(fin.run_ids, fin.values):
                by_seed[seed_of[rid]].append(float(v))
            entry = {"metric": spec.name, "group": {"determinism": det, "stack": stack},
                     "n_seeds": len(by_seed), "n_runs": sum(map(len, by_seed.values())), "final_step": fin.step}
            if len(by_seed) >= 2 and any(len(v) >= 2 for v in by_seed.values()):
                vc = variance_components([by_seed[s] for s in sorted(by_seed)])
                entry.update({"available": True, "components": to_data(vc),
                              "estimator": "one-way random-effects ANOVA (method of moments, n0 for unbalanced)"})
                if det == "none" and not route.reaches(det, stack):
                    entry.update({"between_seed_applies": False, "note": _SEED_NOT_APPLIED})
                else:
                    entry["between_seed_applies"] = True
            elif by_seed:
                entry.update({"available": False, "reason": "need at least 2 seeds and a seed with 2+ repeats"})
            else:
                continue
            out.append(entry)
    return out


_SEED_NOT_APPLIED = ("the seed does not reach the code at 'none' (Steady applies no seed there and the code receives "
                     "none): seed labels are arbitrary, all variance is run to run; the between-seed split does not "
                     "apply")


def _cost(runs, *, confidence, budget=None) -> list[dict]:
    """Step-time ratio per stack for each pair of determinism levels (``steady.server.stats.cost.cost_ratio``).

    Runs are paired by (seed, repeat) — adjacent in the queue (``balanced_level_order``) — when
    each (seed, repeat) has one run per level and both runs of every pair ran on the same worker
    (``RunData.worker``); otherwise the levels are compared as independent samples (Welch).
    ``budget``: the largest acceptable ratio for every pair, judged ``pass``/``fail``/``inconclusive``.
    """
    # stack -> source key -> level -> [((seed, repeat), step times, worker)]
    times: dict[str, dict[str, dict[str, list[tuple]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in runs:
        for key in STEP_TIME_SOURCES:
            sv = _series(r, key)
            if sv is not None and np.isfinite(sv[1]).any():
                times[r.stack][key][r.determinism].append(((r.seed, r.repeat), sv[1], r.worker))
    out = []
    for stack in sorted(times):
        for num, den in COST_PAIRS:
            # one source for both levels: the most direct one that runs of both have
            source = next((k for k in STEP_TIME_SOURCES if num in times[stack][k] and den in times[stack][k]), None)
            if source is not None:
                a = sorted(times[stack][source][num], key=lambda t: t[0])
                b = sorted(times[stack][source][den], key=lambda t: t[0])
                paired = (len(a) >= 2 and [k for k, _, _ in a] == [k for k, _, _ in b]
                          and len({k for k, _, _ in a}) == len(a)
                          and all(wa is not None and wa == wb for (_, _, wa), (_, _, wb) in zip(a, b)))
                cr = cost_ratio([t for _, t, _ in a], [t for _, t, _ in b], numerator=num, denominator=den,
                                confidence=confidence, paired=paired, budget=budget)
                known = all(w is not None for _, _, w in a + b)  # Steady's workers ran them, in balanced order
                out.append({"stack": stack, **to_data(cr), "source": source,
                            "source_text": STEP_TIME_SOURCES[source],
                            "guarantee": cost_guarantee(confidence, interleaved=True if known else None)})
    return out


def _cost_note(runs) -> str | None:
    """Why a study with completed runs has no cost of determinism (None without runs)."""
    if not runs:
        return None
    levels: dict[str, set[str]] = defaultdict(set)
    timed: dict[str, set[str]] = defaultdict(set)
    for r in runs:
        levels[r.stack].add(r.determinism)
        if any((sv := _series(r, k)) is not None and np.isfinite(sv[1]).any() for k in STEP_TIME_SOURCES):
            timed[r.stack].add(r.determinism)
    if all(len(v) < 2 for v in levels.values()):
        names = ", ".join(sorted(set().union(*levels.values())))
        return (f"only one determinism level ({names}) per stack: the cost compares step times between two "
                "levels of one stack")
    if not timed:
        return ("no step times captured: the runs log no step_time, print no step lines the worker reads, and "
                "write no TensorBoard events")
    return ("step times at only one determinism level per stack: "
            + "; ".join(f"{stack}: {', '.join(sorted(timed[stack])) or 'none'} of {', '.join(sorted(levels[stack]))}"
                        for stack in sorted(levels)))


