"""The report's resume section: each resume check a run recorded (``steady.worker.contract.resume``), judged.

Where the run's level promises bitwise repeatability (``strict``; ``seeded`` on a CPU) the check's own
bitwise comparison of the state at the resume point stands: ``identical`` or ``not_restored`` with the
pieces named. Elsewhere nothing is promised bitwise, so the state digests say nothing (an uninterrupted
repeat would differ too); the resumed run's final value is then judged against the seed band: the
range of the final values of the group's seeds. A resumed run that is one more exchangeable draw lands
outside the range of ``n`` seeds with probability ``2 / (n + 1)``: that is the false-alarm level stated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from steady.server.models import Run
from steady.server.reports.parts import ResumeCheck
from steady.worker.contract.resume import LABELS

BITWISE = "bitwise comparison of the state at the resume point and of the final parameters: a difference " \
          "is real, not noise, at a level whose uninterrupted repeats are bitwise identical"


def bitwise_promised(determinism: str, device: str) -> bool:
    return determinism == "strict" or (determinism == "seeded" and device == "cpu")


def _at(record: dict[str, Any]) -> str:
    at = record.get("at") or []
    return "update " + ", ".join(map(str, at)) if len(at) <= 1 else "updates " + ", ".join(map(str, at))


def check_run(run: Run, record: dict[str, Any], metric: str | None, seeds_final: Sequence[float]) -> ResumeCheck:
    """One run's resume check; ``seeds_final``: the final ``metric`` of the group's runs (the seed band)."""
    device = str((run.determinism_applied or {}).get("device") or "cpu")
    base = dict(run_id=run.id, seed=run.seed, stack=run.stack, determinism=run.determinism,
                at=list(record.get("at") or []), steps=record.get("steps"))
    who = f"run {run.id} (seed {run.seed}), killed after {_at(record)} and resumed"
    if record.get("verdict") == "failed":
        reason = record.get("reason") or "the check could not run"
        return ResumeCheck(**base, verdict="failed", summary=f"{who}: the check could not run: {reason}",
                           reason=reason, guarantee="")
    if bitwise_promised(run.determinism, device):
        missing = list(record.get("missing") or [])
        if not missing:
            return ResumeCheck(**base, verdict="identical", summary=f"{who}: identical to the uninterrupted run "
                               "(every piece of state at the resume point and the final parameters bitwise equal)",
                               reason="; ".join(f"resume point {p['step']}: all components equal"
                                                for p in record.get("points") or []), guarantee=BITWISE)
        named = "; ".join(LABELS.get(c, "state the check does not see") for c in missing)
        points = "; ".join(f"after update {p['step']}: {', '.join(p['differ']) or 'nothing'} differ"
                           for p in record.get("points") or [])
        steps = record.get("steps") or {}
        reason = (f"{record.get('reason') or ''} ({points}; updates: {steps.get('reference')} uninterrupted, "
                  f"{steps.get('resumed')} interrupted and resumed)")
        return ResumeCheck(**base, verdict="not_restored", missing=missing,
                           summary=f"{who}: it did not restore the {named}", reason=reason.strip(), guarantee=BITWISE)
    finals = (record.get("final_metrics") or {})
    ref, res = (finals.get("reference") or {}).get(metric or ""), (finals.get("resumed") or {}).get(metric or "")
    band = [float(v) for v in seeds_final]
    level = f"{run.determinism} on {device}"
    if res is None or len(band) < 2:
        why = (f"{metric!r} was not logged through the SDK by the resumed run" if res is None
               else "fewer than 2 seeds to form a band")
        return ResumeCheck(**base, verdict="not_judged", summary=f"{who}: not judged ({level} promises no bitwise "
                           f"repeat, and {why})", reason=why, guarantee="")
    lo, hi = min(band), max(band)
    inside = lo <= res <= hi
    guarantee = (f"a resumed run that is one more draw of the seeds' distribution falls outside the range of "
                 f"{len(band)} seeds with probability 2/(n+1) = {2 / (len(band) + 1):.2g}")
    reason = (f"final {metric} {res:.6g} resumed vs {ref if ref is None else format(ref, '.6g')} uninterrupted; "
              f"seed band [{lo:.6g}, {hi:.6g}] from {len(band)} seeds ({level}: no bitwise promise)")
    if inside:
        return ResumeCheck(**base, verdict="within_seed_band", summary=f"{who}: its final {metric} is within the "
                           "seed band", reason=reason, guarantee=guarantee)
    return ResumeCheck(**base, verdict="outside_seed_band", summary=f"{who}: its final {metric} is outside the "
                       "seed band: the resume changes the result", reason=reason, guarantee=guarantee)


def resume_section(runs: Sequence[Run], metric: str | None) -> list[ResumeCheck] | None:
    """The checks of the completed ``runs`` that recorded one (None when none did)."""
    checked = [r for r in runs if isinstance((r.digests or {}).get("resume"), dict)]
    if not checked:
        return None
    out = []
    for run in checked:
        band = [float(r.final_metrics[metric]) for r in runs
                if metric and r.determinism == run.determinism and r.stack == run.stack
                and isinstance((r.final_metrics or {}).get(metric), (int, float))]
        out.append(check_run(run, run.digests["resume"], metric, band))
    return out
