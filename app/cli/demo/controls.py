"""``steady demo --controls``: planted controls prove that Steady names the source of a difference.

Each control is the reference training of the ``torch_controls`` workload with exactly one
source of nondeterminism planted (see ``worker/inrun/workloads/torch_controls.py``), run so that
the report has something to compare: two repeats of one seed at one level for the
repeatability controls, two seeds on each of two stacks for the stack controls. The runs go
through the worker's subprocess harness (``python -m steady.worker.agent.local``: a fresh process per run,
determinism environment set before the interpreter starts, the same path ``steady worker``
uses) and are judged by the stats core's ``build_report``, the same function behind
``steady report``; no server is started. The table shows, per control, the planted source,
the verdict, the source the report names, the first divergent step and the size of the
difference; a row passes when the named source is the planted one.

The library-version control needs a second virtual environment with another NumPy release:
``numpy_env`` builds it once (the current environment's packages plus one pinned NumPy from the package
index, as a worker builds a stack that pins packages: ``steady.worker.contract.pkgenv``) under the cache
directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from steady.server.reports.models import (
    PortabilityVerdict,
    RepeatabilityVerdict,
    Verdict,
    typed_verdicts,
    verdicts_of,
)
from steady.server.stats.vocabulary import Level
from steady.server.stats.report import MetricSpec, RunData, build_report
from steady.worker.contract import pkgenv

REPO = Path(__file__).resolve().parents[3]
ALT_NUMPY = "2.0.2"  # float32 numpy.sum rounds differently from the 2.3+ releases (checked on x86-64 AVX2)
METRIC = "loss"
MARGIN = 0.05  # equivalence margin on the final loss for the stack controls
DEFAULT_CACHE = Path(os.environ.get("STEADY_CONTROLS_CACHE", Path.home() / ".cache" / "steady" / "controls"))


@dataclass(frozen=True)
class Stack:
    label: str
    threads: int = 1
    numpy: str | None = None  # another NumPy release, in its own virtual environment


@dataclass(frozen=True)
class Control:
    name: str
    expected: str | None  # the source the report must name; None: nothing planted, must be identical
    plant: str = "none"  # the workload's ``plant`` param
    level: str = "seeded"
    order: str = "shuffle"
    threads: int = 1
    stacks: tuple[Stack, ...] = ()  # two for a stack control
    strict_identical: bool = False  # also run at strict and require bitwise identity there
    on_device: bool = False  # runs on the study's device (the others stay on CPU)
    max_repeats: int = 2  # a timing-dependent source gets more repeats until two differ
    framework: str = "torch"
    workload: str = "torch_controls"


CONTROLS: tuple[Control, ...] = (
    Control("initial weights only", "seeding", plant="init"),
    Control("data order only (unseeded shuffle)", "data_order", plant="data_order"),
    Control("kernels only (accumulation order)", "numerics", plant="kernels", threads=2, strict_identical=True,
            on_device=True, max_repeats=6),
    Control("reduction order only (1 vs 2 threads)", "stack",
            stacks=(Stack("threads-1", threads=1), Stack("threads-2", threads=2))),
    Control(f"library version only (NumPy {np.__version__} vs {ALT_NUMPY})", "stack",
            stacks=(Stack(f"numpy-{np.__version__}"), Stack(f"numpy-{ALT_NUMPY}", numpy=ALT_NUMPY))),
    Control("dropout RNG only (unseeded masks)", "seeding", plant="dropout"),
)
VARIANTS: tuple[Control, ...] = (
    Control("reference (nothing planted)", None),
    Control("data order only (PYTHONHASHSEED set order)", "data_order", plant="data_order", order="hashseed",
            level="none"),
    Control("data order only (DataLoader worker seeds)", "data_order", plant="data_order", order="workers"),
)
# Keras: the same plants in TensorFlow, at strict (op determinism on, so only the plant varies).
KERAS_CONTROLS: tuple[Control, ...] = tuple(
    Control(f"Keras: {name}", expected, plant=plant, level="strict", framework="tensorflow", workload="keras_controls")
    for name, expected, plant in (("initial weights only", "seeding", "init"),
                                  ("data order only (unseeded order)", "data_order", "data_order"),
                                  ("dropout RNG only (unseeded layer seed)", "seeding", "dropout"),
                                  ("reference (nothing planted)", None, "none")))
# Overlapping plants: the report names the first cause in the order stack > seeding > data_order > numerics.
OVERLAPS: tuple[Control, ...] = (
    Control("initial weights + data order", "seeding", plant="init+data_order"),
    Control("data order + kernels", "data_order", plant="data_order+kernels", threads=2),
    Control("dropout RNG + kernels", "seeding", plant="dropout+kernels", threads=2),
)


@dataclass(frozen=True)
class Row:
    control: str
    planted: str | None
    level: str
    verdict: str
    source: str | None
    first_divergent_step: int | None
    size: str
    ok: bool
    reason: str
    runs: int = 0
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


def numpy_env(version: str, cache_dir: Path = DEFAULT_CACHE) -> str:
    """The interpreter of an overlay environment that sees this environment's packages but NumPy ``version``
    (installed from the package index once, then cached: ``steady.worker.contract.pkgenv``, the environment a
    worker builds for a stack that pins packages). Returns its python."""
    return pkgenv.overlay_python({"numpy": version}, cache_dir)


def _execute(entries: list[dict], *, failed_ok: bool = False) -> list[dict]:
    """Run the entries through ``python -m steady.worker.agent.local`` (each run in a fresh subprocess).
    A run that failed raises, unless ``failed_ok``: then its result (``ok`` false, the reason) is returned."""
    with tempfile.TemporaryDirectory(prefix="steady-controls-") as tmp:
        runs, out = Path(tmp, "runs.json"), Path(tmp, "out.jsonl")
        runs.write_text(json.dumps(entries))
        subprocess.run([sys.executable, "-m", "steady.worker.agent.local", str(runs), str(out)], check=True, cwd=tmp)
        results = [json.loads(line) for line in out.read_text().splitlines()]
    for entry, r in zip(entries, results):
        if not r["ok"] and not failed_ok:
            spec = entry["spec"]
            what = spec.get("params") or " ".join(spec.get("command") or [])  # a workload's params, or a command
            raise RuntimeError(f"control run {what} {spec['determinism']} seed {spec['seed']} failed "
                               f"({r['failure_kind']}): {r['error']}\n{r['stderr_tail'][-3000:]}")
    return results


RunCache = dict[str, dict]  # a run's entry (spec, device, interpreter) as canonical JSON -> its result


def _execute_cached(entries: list[dict], cache: RunCache | None) -> list[dict]:
    """``_execute``, reusing the result of an entry already run with ``cache``: the same spec (seed, repeat,
    level, threads, params), device and interpreter. Two repeats of one seed differ in ``repeat``, so a control's
    own repeats are always runs of their own; what is shared is, e.g., the reference on one thread that two stack
    controls both compare against."""
    if cache is None:
        return _execute(entries)
    keys = [json.dumps(e, sort_keys=True) for e in entries]
    todo = {k: e for k, e in zip(keys, entries) if k not in cache}
    if todo:
        cache.update(zip(todo, _execute(list(todo.values()))))
    return [cache[k] for k in keys]


def _run_data(run_id: int, entry: dict, result: dict, stack: str) -> RunData:
    spec = entry["spec"]
    series = {k: (np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64))
              for k, (s, v) in result["series"].items()}
    return RunData(run_id=run_id, seed=spec["seed"], repeat=spec["repeat"], determinism=spec["determinism"],
                   stack=stack, fingerprint=result["fingerprint"], digests=result["digests"], series=series)


def _spec(control: Control, *, level: str, seed: int, repeat: int, threads: int, steps: int) -> dict:
    params: dict[str, object] = {"plant": control.plant}
    if control.workload == "torch_controls":
        params.update(order=control.order, steps=steps)
    return {"framework": control.framework, "workload": control.workload, "seed": seed, "repeat": repeat,
            "determinism": level, "threads": threads, "params": params, "time_limit_s": 300}


def _verdict(verdicts: list[Verdict], level: Level, **group) -> Verdict:
    for v in verdicts_of(verdicts, level, METRIC):
        if all(getattr(v.group, k) == x for k, x in group.items()):
            return v
    raise LookupError(f"no {level} verdict for {group} in the report")


def _portability(verdicts: list[Verdict], **group) -> PortabilityVerdict:
    v = _verdict(verdicts, "stack_portability", **group)
    assert isinstance(v, PortabilityVerdict)
    return v


def _repeatability(verdicts: list[Verdict], **group) -> RepeatabilityVerdict:
    v = _verdict(verdicts, "repeatability", **group)
    assert isinstance(v, RepeatabilityVerdict)
    return v


def run_control(control: Control, *, device: str = "cpu", steps: int = 24, cache_dir: Path = DEFAULT_CACHE,
                runs_cache: RunCache | None = None) -> Row:
    t0 = time.monotonic()
    dev = device if control.on_device else "cpu"
    runs: list[RunData] = []

    def add(entries: list[dict], stacks: list[str] | None = None) -> list[RunData]:
        """Run ``entries``; a run's stack is the given label, else the device it really ran on."""
        results = _execute_cached(entries, runs_cache)
        labels = stacks or [str(r["determinism_applied"].get("device", "cpu")) for r in results]
        new = [_run_data(len(runs) + i + 1, e, r, s) for i, (e, r, s) in enumerate(zip(entries, results, labels))]
        runs.extend(new)
        return new

    def entry(level: str, seed: int, repeat: int, threads: int, python: str | None = None) -> dict:
        return {"spec": _spec(control, level=level, seed=seed, repeat=repeat, threads=threads, steps=steps),
                "device": dev, "python": python}

    if control.stacks:
        entries, labels = [], []
        for stack in control.stacks:
            python = numpy_env(stack.numpy, cache_dir) if stack.numpy else None
            for seed in (0, 1):
                entries.append(entry(control.level, seed, 0, stack.threads, python))
                labels.append(stack.label)
        add(entries, labels)
    else:
        first = add([entry(control.level, 0, r, control.threads) for r in range(2)])
        repeat = 2
        # a timing-dependent source may give equal repeats now and then: repeat until two differ
        while repeat < control.max_repeats and all(r.series[METRIC][1].tobytes() == first[0].series[METRIC][1].tobytes()
                                                   and r.digests == first[0].digests for r in runs):
            add([entry(control.level, 0, repeat, control.threads)])
            repeat += 1
        if control.strict_identical:
            add([entry("strict", 0, r, control.threads) for r in range(2)])
    report = typed_verdicts(build_report(runs, [MetricSpec(name=METRIC, margin=MARGIN)], rng=np.random.default_rng(0)))
    seconds = time.monotonic() - t0
    if control.stacks:
        ref, cand = control.stacks[0].label, control.stacks[1].label
        pv = _portability(report, determinism=control.level, reference_stack=ref, candidate_stack=cand)
        pairs = pv.same_seed
        size = f"max abs Δ {_g(pairs.max_abs_delta)}, rel {_g(pairs.max_rel_delta)}"
        if pv.result is not None:
            size += f"; Δmean {_g(pv.result.diff)}"
        return Row(control.name, control.expected, control.level, pv.verdict, pairs.source,
                   pairs.first_divergent_step, size, pairs.source == control.expected, pv.reason,
                   len(runs), seconds)
    stack_label = runs[0].stack
    v = _repeatability(report, determinism=control.level, stack=stack_label)
    verdict: str = v.verdict
    ok = v.source == control.expected
    extra = {"device": stack_label}
    if len({r.stack for r in runs}) > 1:
        raise RuntimeError(f"{control.name}: repeats ran on different devices {sorted({r.stack for r in runs})}")
    if control.strict_identical:
        strict = _repeatability(report, determinism="strict", stack=stack_label)
        verdict += f" (strict: {strict.verdict})"
        ok = ok and strict.verdict == "identical"
        extra["strict_reason"] = strict.reason
    size = f"max abs Δ {_g(v.max_abs_delta)}, rel {_g(v.max_rel_delta)}"
    return Row(control.name, control.expected, control.level, verdict, v.source, v.first_divergent_step,
               size, ok, v.reason, len(runs), seconds, extra)


def _g(x) -> str:
    return "n/a" if x is None or x != x else f"{float(x):.2g}" if isinstance(x, (int, float)) else str(x)


def run_controls(controls: Sequence[Control] = CONTROLS, *, device: str = "cpu", steps: int = 24,
                 cache_dir: Path = DEFAULT_CACHE, progress: Callable[[Row], None] | None = None,
                 runs_cache: RunCache | None = None) -> list[Row]:
    """Each control's row. A run that an earlier control already made (the same spec, device and interpreter:
    the one-thread reference of both stack controls, and of the reference control) is made once and judged
    by each; ``runs_cache`` carries them over to a later call."""
    cache: RunCache = {} if runs_cache is None else runs_cache
    rows = []
    for control in controls:
        row = run_control(control, device=device, steps=steps, cache_dir=cache_dir, runs_cache=cache)
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


HEADER = ("planted source", "level", "expected", "verdict", "named source", "first divergent step",
          "size of the difference", "")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table with its columns padded to their widest cell (also readable in a terminal): the table of
    every ``steady demo --controls`` driver."""
    cells = [tuple(header), *(tuple(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def format_table(rows: Sequence[Row]) -> str:
    return markdown_table(HEADER, [(r.control, r.level, r.planted or "nothing", r.verdict, r.source or "—",
                                    "—" if r.first_divergent_step is None else str(r.first_divergent_step), r.size,
                                    "ok" if r.ok else "WRONG") for r in rows])


def main(args) -> int:
    controls = list(CONTROLS)
    if getattr(args, "variants", False):
        controls += VARIANTS
    if getattr(args, "overlaps", False):
        controls += OVERLAPS
    if getattr(args, "keras", False):
        controls += KERAS_CONTROLS
    device = getattr(args, "device", None) or "cpu"
    print(f"steady demo --controls: {len(controls)} controls, each run in a fresh subprocess "
          f"(kernel control on {device}) …", flush=True)

    def progress(row: Row) -> None:
        print(f"  {'ok   ' if row.ok else 'WRONG'} {row.control}: {row.source or 'nothing named'} ({row.runs} runs, {row.seconds:.0f} s)",
              flush=True)

    rows = run_controls(controls, device=device, progress=progress)
    print()
    print(format_table(rows))
    planted = [r for r in rows if r.planted is not None]
    print(f"\n{sum(r.ok for r in planted)} of {len(planted)} planted sources named exactly", end="")
    references = [r for r in rows if r.planted is None]
    if references:
        print(f"; {sum(r.ok for r in references)} of {len(references)} references bitwise identical", end="")
    print(".")
    return 0 if all(r.ok for r in rows) else 1
