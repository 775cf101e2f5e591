"""Run one RunSpec locally through the subprocess harness, without a server.

    from steady.worker.agent.local import run_local
    result = run_local({"framework": "torch", "workload": "torch_mlp", "seed": 1,
                        "repeat": 0, "determinism": "strict"})
    result.series["loss"]  # (steps, values)

Used by the tests, ``scripts/gpu-check`` and ``steady worker --local``-style tooling.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from steady.worker.agent.runner import RunProcess


@dataclass
class LocalResult:
    ok: bool
    series: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    digests: dict[str, Any] = field(default_factory=dict)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    determinism_applied: dict[str, Any] = field(default_factory=dict)
    final_metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    failure_kind: str | None = None
    error: str = ""
    stderr_tail: str = ""
    returncode: int | None = None
    conflicts: dict[str, Any] | None = None  # protocol.MetricConflicts: values logged twice, differently

    def values(self, key: str) -> list[float]:
        return self.series.get(key, ([], []))[1]


def _spec_dict(spec: Any) -> dict[str, Any]:
    if hasattr(spec, "model_dump"):
        return spec.model_dump(mode="json")
    d = dict(spec)
    for k, v in list(d.items()):
        d[k] = getattr(v, "value", v)
    d.setdefault("repeat", 0)
    return d


def run_local(
    spec: Any,
    *,
    device: str | None = None,
    work_dir: str | None = None,
    keep: bool = False,
    poll_interval: float = 0.05,
    on_start: Any = None,
    python: str | None = None,
    code_dir: str | None = None,
    **process_options: Any,
) -> LocalResult:
    """Execute ``spec`` (a RunSpec or a dict with its fields) in a fresh subprocess and wait.

    ``on_start(proc)`` is called once the subprocess runs (tests use it to kill it); ``python``
    is the interpreter of the run (default: this one), e.g. another virtual environment's;
    ``code_dir`` an unpacked code archive the run starts in (its ``code_workdir`` inside it);
    ``process_options`` go to :class:`~steady.worker.agent.runner.RunProcess` (``run_vars``, ``secrets``,
    ``run_as``, ``pass_env``)."""
    run_dir = work_dir or tempfile.mkdtemp(prefix="steady-run-")
    proc = RunProcess(_spec_dict(spec), run_dir=run_dir, device=device, python=python, **process_options)
    proc.code_dir = code_dir
    series: dict[str, tuple[list[int], list[float]]] = {}

    def drain() -> None:
        for event in proc.poll():
            if event.get("e") == "m":
                for key, value in event["v"].items():
                    steps, values = series.setdefault(key, ([], []))
                    steps.append(event["s"])
                    values.append(value)

    try:
        proc.start()
        if on_start is not None:
            on_start(proc)
        while proc.running():
            drain()
            proc.check_time_limit()
            time.sleep(poll_interval)
        outcome = proc.outcome()
        drain()
        c = proc.collected
        result = c.result or {}
        timings = dict(result.get("timings") or {})
        timings["wall_s"] = outcome.wall_s
        return LocalResult(
            ok=outcome.ok,
            series=series,
            digests=c.digests_model(),
            fingerprint=c.fingerprint,
            determinism_applied=c.determinism_applied,
            final_metrics={**c.captured, **(result.get("final_metrics") or {})},
            timings=timings,
            failure_kind=outcome.kind,
            error=outcome.error,
            stderr_tail=proc.stderr_tail(),  # again: its notes count what drain() skipped after the exit
            returncode=outcome.returncode,
            conflicts=proc.guard.summary(),
        )
    finally:
        if proc.running():
            proc.kill("cancelled")
            proc.wait()
        if not keep and work_dir is None:
            shutil.rmtree(run_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m steady.worker.agent.local RUNS.json OUT.jsonl``: run each entry of RUNS.json (a list of
    ``{"spec": {...}, "device": ..., "python": ...}``) in turn, appending one JSON line per
    result (the fields of :class:`LocalResult`) to OUT.jsonl. Lets a caller that must not
    import the worker (the server side's ``steady demo --controls``) run local runs."""
    import argparse
    import dataclasses
    import json

    p = argparse.ArgumentParser(prog="python -m steady.worker.agent.local", description=(main.__doc__ or "").split("\n\n")[0])
    p.add_argument("runs")
    p.add_argument("out")
    args = p.parse_args(argv)
    with open(args.runs, encoding="utf-8") as f:
        entries = json.load(f)
    with open(args.out, "a", encoding="utf-8") as out:
        for entry in entries:
            result = run_local(entry["spec"], device=entry.get("device"), python=entry.get("python"))
            out.write(json.dumps(dataclasses.asdict(result)) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
