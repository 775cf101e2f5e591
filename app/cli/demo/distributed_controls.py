"""``steady demo --controls --distributed``: planted controls prove that Steady names the distributed layer.

Each control is the built-in ``torch_distributed`` workload (``worker/inrun/workloads/torch_distributed.py``:
data-parallel training of a small MLP on digits by 3 or 4 local processes, gloo on CPU) with one setting of
the distributed layer planted, run as ``distributed: {nproc: N}`` through the worker's own path
(``python -m steady.worker.agent.local``: the runner, the multi-process driver, the harness in every rank).
Per seed, two repeats at ``seeded`` are judged by ``build_report`` (the function behind ``steady report``);
a seed counts when its repeatability verdict names the expected source (``distributed``, ``data_order``), or
is ``identical`` for a reference. The world-size control runs every seed at 3 and at 4 ranks, as two stacks:
its row counts the seeds whose same-seed comparison names ``stack`` and shows the TOST verdict on the final
loss (a difference of a few ULPs must not be ``not_equivalent``). No server is started.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from steady.server.cli.demo.controls import (
    MARGIN,
    METRIC,
    _execute,
    _portability,
    _repeatability,
    _run_data,
    markdown_table,
)
from steady.server.reports.models import typed_verdicts
from steady.server.stats.report import MetricSpec, RunData, build_report

LEVEL = "seeded"


@dataclass(frozen=True)
class DistControl:
    name: str
    expected: str | None  # the source every seed's report must name; None: bitwise identical
    plant: str = "none"
    nproc: int = 3
    reduce: str = "ddp"
    world_sizes: tuple[int, ...] = ()  # two: a stack control (the same seeds at both world sizes)


CONTROLS: tuple[DistControl, ...] = (
    DistControl("reference, DDP", None, nproc=3),
    DistControl("reference, DDP", None, nproc=4),
    DistControl("reference, manual all-reduce in a fixed order", None, nproc=3, reduce="manual"),
    DistControl("reduction order varied (manual all-reduce)", "distributed", "reduction_order", nproc=3),
    DistControl("reduction order varied (manual all-reduce)", "distributed", "reduction_order", nproc=4),
    DistControl("DDP bucket_cap_mb 0.004 vs 0.006", "distributed", "bucket", nproc=3),
    DistControl("per-rank PYTHONHASHSEED (layer order)", "distributed", "hashseed", nproc=3),
    DistControl("unseeded DistributedSampler", "data_order", "sampler", nproc=3),
    DistControl("world size 3 vs 4", "stack", world_sizes=(3, 4)),
)


@dataclass(frozen=True)
class DistRow:
    control: str
    ranks: str
    expected: str | None
    seeds: int
    right: int  # seeds judged as the control requires
    named: tuple[str, ...]  # the sources the reports named, all seeds together
    verdicts: tuple[str, ...]
    first_divergent_step: int | None  # of the first seed that differed
    reason: str  # of the first seed (a reference: its verdict's reason)
    seconds: float

    @property
    def ok(self) -> bool:
        return self.right == self.seeds


def entry(control: DistControl, seed: int, repeat: int, nproc: int, *, steps: int = 12) -> dict:
    params = {"plant": control.plant, "reduce": control.reduce, "steps": steps}
    return {"spec": {"framework": "torch", "workload": "torch_distributed", "seed": seed, "repeat": repeat,
                     "determinism": LEVEL, "threads": 1, "params": params, "time_limit_s": 600,
                     "distributed": {"nproc": nproc, "backend": "gloo"}}, "device": "cpu"}


def _report(runs: list[RunData]):
    return typed_verdicts(build_report(runs, [MetricSpec(name=METRIC, margin=MARGIN)], rng=np.random.default_rng(0)))


def run_control(control: DistControl, seeds: Sequence[int], *, steps: int = 12) -> DistRow:
    t0 = time.monotonic()
    if control.world_sizes:
        entries = [entry(control, seed, 0, n, steps=steps) for n in control.world_sizes for seed in seeds]
        labels = [f"{n}-ranks" for n in control.world_sizes for _ in seeds]
        results = _execute(entries)
        runs = [_run_data(i + 1, e, r, s) for i, (e, r, s) in enumerate(zip(entries, results, labels))]
        report = _report(runs)
        pv = _portability(report, determinism=LEVEL, reference_stack=labels[0], candidate_stack=labels[-1])
        pair_named: list[str] = []
        right = 0
        for seed in seeds:  # each seed on both world sizes, compared step by step (the report's same-seed rule)
            pair = [r for r in runs if r.seed == seed]
            sv = _repeatability(_report([dataclasses.replace(r, stack="pair", repeat=i) for i, r in enumerate(pair)]),
                                determinism=LEVEL, stack="pair")
            pair_named.append(sv.source or "—")
            right += sv.source == control.expected
        return DistRow(control.name, " vs ".join(map(str, control.world_sizes)), control.expected, len(seeds),
                       right if pv.verdict != "not_equivalent" else 0, tuple(sorted(set(pair_named))),
                       (f"TOST: {pv.verdict}",), pv.same_seed.first_divergent_step, pv.reason, time.monotonic() - t0)
    entries = [entry(control, seed, repeat, control.nproc, steps=steps) for seed in seeds for repeat in (0, 1)]
    results = _execute(entries)
    runs = [_run_data(i + 1, e, r, "default") for i, (e, r) in enumerate(zip(entries, results))]
    named: list[str] = []
    verdicts: list[str] = []
    first: int | None = None
    right, reason = 0, ""
    for seed in seeds:
        v = _repeatability(_report([r for r in runs if r.seed == seed]), determinism=LEVEL, stack="default")
        verdicts.append(v.verdict)
        named.append(v.source or "—")
        ok = v.verdict == "identical" if control.expected is None else v.source == control.expected
        right += ok
        if not reason or (first is None and v.first_divergent_step is not None):
            first, reason = v.first_divergent_step, v.reason
    return DistRow(control.name, str(control.nproc), control.expected, len(seeds), right, tuple(sorted(set(named))),
                   tuple(sorted(set(verdicts))), first, reason, time.monotonic() - t0)


def run_controls(controls: Sequence[DistControl] = CONTROLS, *, seeds: Sequence[int] = range(5), steps: int = 12,
                 progress: Callable[[DistRow], None] | None = None) -> list[DistRow]:
    rows = []
    for control in controls:
        row = run_control(control, seeds, steps=steps)
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


HEADER = ("planted", "ranks", "must be named", "judged as required", "verdicts", "named")


def format_table(rows: Sequence[DistRow]) -> str:
    return markdown_table(HEADER, [(r.control, r.ranks, r.expected or "nothing (identical)", f"{r.right} of {r.seeds}",
                                    ", ".join(r.verdicts), ", ".join(r.named)) for r in rows])


def main(args) -> int:
    seeds = range(int(getattr(args, "seeds", None) or 5))
    controls = [c for c in CONTROLS if not getattr(args, "only", None) or any(o in c.name for o in args.only)]
    print(f"steady demo --controls --distributed: {len(controls)} controls × {len(seeds)} seeds, each run by 3 or 4 "
          "local processes (gloo on CPU) …", flush=True)

    def progress(row: DistRow) -> None:
        print(f"  {'ok   ' if row.ok else 'WRONG'} {row.control} ({row.ranks} ranks): {', '.join(row.named)} "
              f"({row.right} of {row.seeds}, {row.seconds:.0f} s)", flush=True)
        if row.reason:
            print(f"        {row.reason}", flush=True)

    rows = run_controls(controls, seeds=seeds, progress=progress)
    print()
    print(format_table(rows))
    print(f"\n{sum(r.ok for r in rows)} of {len(rows)} controls judged as required for every seed.")
    return 0 if all(r.ok for r in rows) else 1
