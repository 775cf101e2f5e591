"""The three verdict levels of the study report, one builder each: repeatability (per seed,
repeats against the lowest repeat), seed stability (the band and the final-value spread) and
stack portability (every stack against the reference, adjusted over the report's comparisons).
``steady.server.stats.report.build_report`` puts them together."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from steady.server.stats import expectations, guarantees, plain
from steady.server.stats.expectations import BUILTIN, SeedRoute
from steady.server.stats.bands import DEFAULT_QUANTILES, out_of_band_curves
from steady.server.stats.portability import adjust, band_containment, compare_stacks
from steady.server.stats.repeatability import VERDICT_ORDER, RepeatRun, repeatability, size_phrase
from steady.server.stats.resolution import (
    WEIGHT_DIGESTS,
    Compared,
    compared,
    equal_phrase,
    identical_words,
    same_phrase,
)
from steady.server.stats.report_data import (
    BandMembers,
    Finals,
    MetricSpec,
    RunData,
    SeedStages,
    Verdict,
    _group_band,
    _one_per_seed,
    _series,
    _with_metric,
    final_step_phrase,
    final_step_spread,
    group_band,
    last_finals,
)
from steady.server.stats.seed_stability import metric_resolution, seed_spread
from steady.server.stats.sequential import sequential_seed_decision, stopped_early
from steady.server.stats.sequential_tost import sequential_tost_decision, sequential_tost_reason
from steady.server.stats.serialize import to_data
from steady.server.stats.stack_pairs import stack_pairs


def _repeatability_verdicts(groups, spec: MetricSpec, *, route: SeedRoute = BUILTIN) -> list[Verdict]:
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
        fact = _compared([r for rs, _ in per_seed.values() for r in rs], spec.name)
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
                    reason = f"{det} runs of seed {worst_seed} {equal_phrase(fact, w.n_runs)}"
                else:
                    reason = f"{det} runs, the repeats of each of {len(conclusive)} seeds {equal_phrase(fact)}"
            else:
                reason = f"seed {worst_seed} (worst of {len(conclusive)}): {w.reason}"
                if w.source == "numerics" and "data_order" in fact.missing:  # the order was not compared
                    reason += f"; the data order is not ruled out (no data-order digest: {fact.missing['data_order']})"
        detail = [{"seed": s, "run_ids": [r.run_id for r in rs], **to_data(res)} for s, (rs, res) in per_seed.items()]
        firsts = [rs[0] for rs, _ in per_seed.values()]
        seeds_identical = _all_identical(firsts, spec.name) if len(firsts) >= 2 else None
        exp = expectations.repeatability_expectation(
            det, verdict, source=conclusive[worst_seed][1].source if worst_seed is not None else None,
            seeds_identical=seeds_identical, route=route, stack=stack,
            deltas_finite=all(np.isfinite(res.max_abs_delta) for _, res in conclusive.values()),
            same=same_phrase(_compared(firsts, spec.name)) if seeds_identical else "bitwise identical")
        numbers = {}
        if worst_seed is not None:
            w = conclusive[worst_seed][1]
            numbers = {"worst_seed": worst_seed, "max_abs_delta": max(v[1].max_abs_delta for v in conclusive.values()),
                       "max_rel_delta": max(v[1].max_rel_delta for v in conclusive.values()),
                       "max_ulps": _max_ulps([v[1].max_ulps for v in conclusive.values()]),
                       "resolution": max((v[1].resolution for v in conclusive.values() if v[1].resolution is not None),
                                         default=None),
                       "first_divergent_step": w.first_divergent_step, "source": w.source,
                       "steps_compared": w.steps_compared, "last_steps": list(w.last_steps),
                       "data_order_epoch": w.data_order_epoch}
        first = plain.repeatability_line(verdict, det, exp, numbers, n_seeds=len(per_seed), compared=fact)
        out.append(Verdict("repeatability", spec.name, {"determinism": det, "stack": stack}, verdict, n_runs, reason,
                           {**numbers, "summary": first, "atol": spec.atol, "rtol": spec.rtol, "per_seed": detail,
                            "dtype": _dtype(group_runs, spec.name),
                            "seeds_identical": seeds_identical, "n_seeds_compared": len(firsts),
                            "expected": exp.expected, "met_expectation": exp.met, "expectation": exp.phrase,
                            "suspicious": list(exp.suspicious),
                            "compared": fact.to_data(), "guarantee": guarantees.repeatability(fact)}))
    return out


def _compared(runs: Sequence[RunData], metric: str) -> Compared:
    """What the repeats of a group are compared on: their values at the printed precision or bit for bit,
    the digests they all recorded, and the weight digests missing with the reason the runs gave."""
    printed = [r.resolutions[metric] for r in runs if r.resolutions.get(metric) is not None]
    last = [float(sv[1][-1]) for r in runs if (sv := _series(r, metric)) is not None and sv[1].size]
    return compared([r.digests for r in runs], [r.digest_notes for r in runs],
                    resolution=max(printed) if printed else None, dtype=_dtype(runs, metric), last_values=last)


def _max_ulps(ulps: Sequence[int | None]) -> int | None:
    """None when any series was parsed from text (no ULPs), else the largest count."""
    return None if None in ulps else max((u for u in ulps if u is not None), default=0)


def _dtype(runs: Sequence[RunData], metric: str) -> str:
    found = {r.dtypes.get(metric) for r in runs if metric in r.series} - {None}
    return str(found.pop()) if len(found) == 1 else "float64"


def _repeat_run(r: RunData, metric: str) -> RepeatRun:
    steps, values = _series(r, metric)
    return RepeatRun(steps=steps, values=values, fingerprint=r.fingerprint,
                     initial_weights=r.digests.get("initial_weights"),
                     data_order=tuple(r.digests.get("data_order") or ()),
                     other_digests={k: r.digests.get(k) for k in ("final_weights", "optimizer_state")},
                     dtype=r.dtypes.get(metric), resolution=r.resolutions.get(metric),
                     distributed=r.digests.get("distributed"))


def _all_identical(runs: Sequence[RunData], metric: str) -> bool:
    """True when every run's series of ``metric`` has the same steps and bitwise the same values, and no weight
    digest tells two runs apart (values printed to 2 decimals can agree where the weights did not)."""
    for kind in WEIGHT_DIGESTS:
        found = [r.digests.get(kind) for r in runs]
        if all(found) and len(set(found)) > 1:
            return False
    ref_steps, ref_values = _series(runs[0], metric)
    for r in runs[1:]:
        steps, values = _series(r, metric)
        if not (np.array_equal(steps, ref_steps) and values.shape == ref_values.shape
                and np.array_equal(values.view(np.int64), ref_values.view(np.int64))):
            return False
    return ref_values.size > 0


_SPENDING_NAMES = {"pocock": "Pocock-type", "obrien_fleming": "O'Brien–Fleming-type"}


def _seed_resolution(chosen, spec: MetricSpec, values: np.ndarray, *, staged: bool) -> float | None:
    """The resolution a tie of final values is judged at (``seed_stability.metric_resolution``): only looked
    for when the finals tie, or when an adaptive study may judge a stage whose finals tie."""
    if not staged and not (values.size and np.all(values == values[0])):
        return spec.resolution
    curves = [sv[1][np.isfinite(sv[1])] for r in chosen if (sv := _series(r, spec.name)) is not None]
    return metric_resolution(spec.resolution, [r.resolutions.get(spec.name) for r in chosen], curves)


def _sequential(chosen, fin: Finals, max_std: float, stages: SeedStages, *, alpha: float,
                resolution: float | None = None):
    seed_of = {r.run_id: r.seed for r in chosen}
    by_stage: list[list[float]] = [[] for _ in range(stages.current)]
    for v, i in zip(fin.values, fin.run_ids):
        by_stage[int(stages.stage_of_seed.get(seed_of[i], 1)) - 1].append(v)
    return sequential_seed_decision(by_stage, max_std=max_std, max_seeds=stages.max_seeds,
                                    last_stage=stages.last_stage, alpha=alpha, spending=stages.spending,
                                    stopped=stages.stopped, resolution=resolution)


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
    tail = stopped_early(d.verdict, d.final, d.stopped, more="more seeds come in the next stage")
    return (f"{head}: inconclusive at stage {look.stage} with {look.n_seeds} seeds (boundary z "
            f"{look.boundary:.3f}{bounds}); {tail}")


def _seed_verdicts(groups, spec: MetricSpec, *, coverage, confidence, alpha, false_alarm,
                   stages: SeedStages | None = None, bands: list | None = None,
                   route: SeedRoute = BUILTIN) -> list[Verdict]:
    out = []
    for (det, stack), group_runs in groups.items():
        chosen, aligned, band = _group_band(group_runs, spec.name, coverage=coverage, confidence=confidence,
                                            quantiles=DEFAULT_QUANTILES)
        if not chosen:
            continue
        fin = last_finals(chosen, spec.name)  # each run's last logged value, whatever its step
        values, ids, bad = fin.values, fin.run_ids, fin.diverged_run_ids
        resolution = _seed_resolution(chosen, spec, values, staged=stages is not None)
        spread = seed_spread(values, max_std=spec.max_std, coverage=coverage, confidence=confidence, alpha=alpha,
                             n_diverged=len(bad), resolution=resolution)
        reason = spread.reason
        verdict, sequential = spread.verdict, None
        if stages is not None and spec.max_std is not None and not bad and fin.values.size:
            sequential = _sequential(chosen, fin, spec.max_std, stages, alpha=alpha, resolution=resolution)
            verdict = sequential.verdict
            reason = (_sequential_reason(sequential, stages, alpha)
                      + f"; for reference, the fixed-sample rule on all {spread.n} seeds: {spread.reason}")
        per_seed = len(chosen) < len(_with_metric(group_runs, spec.name))
        without_effect = len(chosen) >= 2 and _all_identical(chosen, spec.name)
        if without_effect and stack in route.pinned:
            # a sources study's arm that pins every seed the code reads: its runs are repeats by design,
            # not evidence about the seed; seed stability is judged in the arms that vary a source
            if bands is not None:
                bands.append(group_band(BandMembers((det, stack), chosen, per_seed), spec.name, band, aligned.diverged,
                                        max_points=None))
            continue
        same = same_phrase(_compared(chosen, spec.name)) if without_effect else "bitwise identical"
        if without_effect:
            verdict, reason, sequential = _seeds_without_effect(len(chosen), det, route, same=same)
        step_spread = final_step_spread(fin)
        reason += _final_where(fin, step_spread) + _restarted(chosen, spec.name)
        if bad:
            reason += f"; diverged run(s) {', '.join(map(str, bad))} excluded from the band"
        if per_seed:
            reason += "; one run per seed (first repeat)"
        if bands is not None:  # the same GroupBand as compute_bands gives for this group
            bands.append(group_band(BandMembers((det, stack), chosen, per_seed), spec.name, band, aligned.diverged,
                                    max_points=None))
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
                        "guarantee": guarantees.out_of_band(false_alarm, skew_ok=oob.skew_ok)}
            if flagged:
                late = oob.by_window if oob.by_window is not None else np.zeros(len(kept_ids), dtype=bool)
                spans = oob.window_steps or (None,) * len(kept_ids)
                named = [f"{rid} (steps {int(aligned.steps[sp[0]])}–{int(aligned.steps[sp[1]])})"
                         if lt and sp is not None else str(rid)
                         for rid, f, lt, sp in zip(kept_ids, oob.flagged, late, spans) if f]
                reason += (f"; out of band: run(s) {', '.join(named)} "
                           f"(whole curve or its worst tenth vs the other runs, false alarm ≤ {false_alarm:g} per study)")
            if not oob.skew_ok:
                reason += f"; {oob.reason.split('; ', 1)[-1]}"
            if not oob.testable and not aligned.present[keep].all(axis=0).any():
                reason += ("; the runs share no logged step, so no step's band holds them all and the whole-curve "
                           "out-of-band test was not run")
        first = plain.seed_line(verdict, spread, sequential=sequential, n_seeds=len(chosen),
                                identical=without_effect, same=same) + _restarted_short(chosen, spec.name)
        out.append(Verdict("seed_stability", spec.name, {"determinism": det, "stack": stack}, verdict,
                           len(chosen), reason,
                           {"summary": first, "spread": spread, "final_values": values, "final_run_ids": ids, "diverged_run_ids": bad,
                            "final_step": fin.step, "short_run_ids": fin.short_run_ids,
                            "final_steps": list(fin.steps), "final_step_spread": step_spread,
                            "one_run_per_seed": per_seed,
                            "n_needed": None if without_effect else spread.n_needed,
                            "out_of_band": flagged, "out_of_band_test": oob_info,
                            "sequential": sequential,
                            "guarantee": guarantees.seed_stability(alpha, sequential=sequential is not None)}))
    return out


def _restarted(runs: Sequence[RunData], metric: str) -> str:
    """The end of a reason when some runs' step counter went back (``RunData.restarts``): which value was judged."""
    hit = [r for r in runs if metric in r.restarts]
    if not hit:
        return ""
    r = hit[0].restarts[metric]
    return (f"; run(s) {', '.join(str(x.run_id) for x in hit)}: the final value judged is the first value logged at "
            f"the run's highest step, not its last printed one (run {hit[0].run_id}'s step counter went back at output "
            f"line {r.get('line')}, step {r.get('step_before')} then {r.get('step_after')}: name the epoch in the "
            "capture pattern to keep every value)")


def _restarted_short(runs: Sequence[RunData], metric: str) -> str:
    """The same on the verdict's own line."""
    n = sum(1 for r in runs if metric in r.restarts)
    return (f" (judged on the first value at each run's highest step, not the last printed one: the step counter "
            f"restarted in {n} run(s))") if n else ""


def _final_where(fin: Finals, step_spread: dict | None) -> str:
    """``; final values at step 999`` or ``; final values at each run's last step, 325–1,450 (the runs
    stopped at different steps: median 790, …)``; empty without a final value."""
    where = fin.where()
    if not where:
        return ""
    phrase = final_step_phrase(step_spread)
    return f"; final values {where}" + (f" ({phrase})" if phrase else "")


def _seeds_without_effect(n: int, det: str, route: SeedRoute, *, same: str = "bitwise identical"
                          ) -> tuple[str, str, None]:
    """Runs of ``n`` different seeds bitwise identical. Where the seed reached the code this is
    evidence that it has no effect: not stability (nothing varied, so the spread says nothing about
    other seeds) but a finding that fails. Where it did not (``none`` and code that receives no seed),
    the seeds were only labels: the runs are repeats, and seed stability cannot be judged."""
    if route.reaches(det):
        return ("seed_has_no_effect",
                f"runs of all {n} seeds are {same}: the seed has no effect (the code ignores the seed "
                "it is given, e.g. a hard-coded seed), so the spread over seeds is 0 by construction and says "
                "nothing about other seeds", None)
    why = ("the command has no {seed} placeholder" if route.kind == "command"
           else "Steady seeds nothing at none")
    return ("inconclusive",
            f"runs of all {n} seeds are {same}, but the seed does not reach the code at none ({why}): "
            "the seeds are only labels here, so seed stability cannot be judged at this level", None)


def _split_by_stage(values, run_ids, seed_of: dict, stages: SeedStages | None) -> list[list[float]] | None:
    """Final values per stage that added their seed (None: not an adaptive study)."""
    if stages is None:
        return None
    out: list[list[float]] = [[] for _ in range(stages.current)]
    for v, i in zip(values, run_ids):
        out[int(stages.stage_of_seed.get(seed_of[i], 1)) - 1].append(float(v))
    return out


def _portability_verdicts(groups, spec: MetricSpec, *, reference_stack, alpha, rng, coverage, confidence,
                          stages: SeedStages | None = None):
    pending: list[tuple] = []
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
            both = last_finals(ref_runs + cand_runs, spec.name)  # each run's last logged value, whatever its step
            ref_ids = {r.run_id for r in ref_runs}
            seed_of = {r.run_id: r.seed for r in ref_runs + cand_runs}
            split = (_split_by_stage([v for v, i in zip(both.values, both.run_ids) if i in ref_ids],
                                     [i for i in both.run_ids if i in ref_ids], seed_of, stages),
                     _split_by_stage([v for v, i in zip(both.values, both.run_ids) if i not in ref_ids],
                                     [i for i in both.run_ids if i not in ref_ids], seed_of, stages))
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
                    "final_steps": list(both.steps), "final_step_spread": final_step_spread(both),
                    "restarted": _restarted(ref_runs + cand_runs, spec.name),
                    "same_seed": _same_seed(stacks[ref], stacks[cand], spec)}
            if ref_vals.size < 2 or cand_vals.size < 2:
                pending.append((group, None, base, split))
            else:
                pending.append((group, compare_stacks(ref_vals, cand_vals, margin=spec.margin, rng=rng, alpha=alpha),
                                base, split))
    return pending


def _finish_portability(pending, *, alpha, method, stages: SeedStages | None = None) -> list[Verdict]:
    """The portability verdicts, adjusted over the report's comparisons. In an adaptive study
    (``stages``) a verdict with a margin is the group-sequential TOST of
    ``steady.server.stats.sequential_tost`` at α / (number of TOST comparisons) (Bonferroni: Holm's step-down
    has no stage-wise form here)."""
    tost_idx = [i for i, (_, _, res, *_) in enumerate(pending) if res is not None and res.tost is not None]
    welch_idx = [i for i, (_, _, res, *_) in enumerate(pending) if res is not None]
    tost_adj = dict(zip(tost_idx, adjust([pending[i][2].tost.p_value for i in tost_idx], method=method))) \
        if tost_idx else {}
    welch_adj = dict(zip(welch_idx, adjust([pending[i][2].welch.p_value for i in welch_idx], method=method))) \
        if welch_idx else {}
    out = []
    n_tost = max(len(tost_idx), 1)
    for i, (spec, group, res, base, split) in enumerate(pending):
        n_runs = base["n_reference"] + base["n_candidate"]
        seq, seq_last = None, 1
        if stages is not None and spec.margin is not None and split[0] is not None:
            seq_last = stages.last_stage
            seq = sequential_tost_decision(split[0], split[1], margin=spec.margin, max_seeds=stages.max_seeds,
                                           last_stage=stages.last_stage, alpha=alpha / n_tost,
                                           spending=stages.spending, stopped=stages.stopped)
        restarted = base.pop("restarted", "")
        details = {**base, "adjust_method": method, "n_comparisons_tost": len(tost_idx),
                   "n_comparisons_welch": len(welch_idx), "sequential": seq,
                   "guarantee": guarantees.stack_portability(alpha, method, sequential=seq is not None)}
        if res is None:
            out.append(Verdict("stack_portability", spec.name, group, "inconclusive", n_runs,
                               f"need at least 2 finite runs per stack (reference {base['n_reference']}, "
                               f"candidate {base['n_candidate']})",
                               {**details, "n_needed": 2, "summary": plain.portability_line("inconclusive", details)}))
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
            if tost_adj[i] < alpha and res.tost is not None and res.tost.withheld:
                verdict, reason = "inconclusive", f"{d}, TOST p={tost_adj[i]:.3g} ({method}), but {res.tost.withheld}"
            elif tost_adj[i] < alpha:
                verdict, reason = "equivalent", f"{d} within ±{m:g}: TOST p={tost_adj[i]:.3g} ({method})"
            elif res.diff_ci_low > m or res.diff_ci_high < -m:
                verdict, reason = "not_equivalent", f"{d} entirely outside ±{m:g}"
            else:
                verdict = "inconclusive"
                reason = f"{d}, TOST p={tost_adj[i]:.3g} ({method}) ≥ {alpha:g}" + (
                    "; indistinguishable from the margin at this precision" if
                    res.diff_ci_low <= m <= res.diff_ci_high or res.diff_ci_low <= -m <= res.diff_ci_high else "") + (
                    f"; {res.plan}" if res.plan else "")
            if res.tost is not None and res.tost.small_sample:
                reason += f"; {res.tost.small_sample}"
        else:
            if welch_adj[i] < alpha:
                verdict, reason = "not_equivalent", f"no margin given; {d}, Welch p={welch_adj[i]:.3g} ({method})"
            else:
                verdict, reason = "inconclusive", f"no margin given, equivalence cannot be claimed; {d}"
        if seq is not None:
            verdict = seq.verdict
            reason = (sequential_tost_reason(seq, last_stage=seq_last, n_comparisons=n_tost)
                      + f"; for reference, the fixed-sample rule on all seeds: {reason}")
        if base["diverged_run_ids"]:
            reason += f"; {len(base['diverged_run_ids'])} diverged run(s) excluded"
        reason += same_seed_phrase(base["same_seed"]) + restarted
        reason += _final_where(Finals(np.zeros(0), [], [], base["final_step"], [], tuple(base["final_steps"])),
                               base["final_step_spread"])
        details["summary"] = plain.portability_line(verdict, details)
        out.append(Verdict("stack_portability", spec.name, group, verdict, n_runs, reason, details))
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


def same_seed_phrase(pairs) -> str:
    """The end of a portability verdict's reason: the same seeds on both stacks compared step by step."""
    if pairs.n_pairs == 0:
        return ""
    if pairs.verdict == "identical":
        return f"; same seed on both stacks: {identical_words(pairs.resolution)} ({pairs.n_pairs} seed(s))"
    size = (f"max |Δ| {pairs.max_abs_delta:.3g} ({pairs.max_ulps} ULPs)" if pairs.resolution is None
            else size_phrase(pairs.max_abs_delta, pairs.max_ulps, pairs.resolution))
    return (f"; same seed on both stacks: source {pairs.source}, first divergence at step "
            f"{pairs.first_divergent_step}, {size}")

