"""Localize where two runs of the same spec part: replay them, find the step, trace it, name the op.

    from steady.worker.agent.localize import localize_pair
    answer = localize_pair(spec_a, spec_b, code_dir="/path/to/unpacked/code")
    answer["sentence"]  # "first divergent op: `aten::index_add_` in `Net.pool` (forward) at train.py:42, step 2, ..."

Both runs are re-run as they ran (same seed, same spec, the user's own code, unchanged) in fresh
subprocesses, side by side. Without the step known (``step=None``), a first pair of replays records
the per-step state digests (``STEADY_LOCALIZE=steps``, :mod:`steady.worker.inrun.localize`) and
gives the first divergent step; a second pair traces that step at the dispatcher and the traces are
aligned (:func:`steady.worker.contract.oplocate.first_divergent_op`). With the step known (the runs
recorded their digests), only the second pair runs: two replays.

``python -m steady.worker.agent.localize SPEC_A.json SPEC_B.json [--code DIR] [--step K]`` prints the
answer as JSON.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from steady.worker.agent.local import LocalResult, run_local
from steady.worker.contract.oplocate import first_divergent_op, first_divergent_step

MODE_ENV, STEP_ENV, OUT_ENV = "STEADY_LOCALIZE", "STEADY_LOCALIZE_STEP", "STEADY_LOCALIZE_OUT"


def _replay(spec: dict[str, Any], mode: str, step: int, out: str, **options: Any) -> LocalResult:
    return run_local(spec, run_vars={MODE_ENV: mode, STEP_ENV: str(step), OUT_ENV: out}, **options)


def _read_digests(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return []
    return [x for x in lines[:-1] if x]  # the last piece may be a line still being written


def _pair(specs: tuple[dict[str, Any], dict[str, Any]], mode: str, step: int, folder: str,
          **options: Any) -> tuple[list[str], list[LocalResult]]:
    """Both replays side by side. Digest replays are watched and stopped as soon as their digests part
    (the rest of the training is not needed)."""
    outs = [os.path.join(folder, f"{mode}-{i}.out") for i in (0, 1)]
    procs: list[Any] = []
    lock = threading.Lock()

    def started(proc: Any) -> None:
        with lock:
            procs.append(proc)

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(_replay, specs[i], mode, step, outs[i], on_start=started, **options) for i in (0, 1)]
        while mode == "steps" and not all(f.done() for f in futures):
            a, b = _read_digests(outs[0]), _read_digests(outs[1])
            if first_divergent_step(a[:len(b)], b[:len(a)]) is not None:
                with lock:
                    for proc in procs:
                        if proc.running():
                            proc.kill("the step digests parted: the rest of the replay is not needed")
                break
            time.sleep(0.2)
        results = [f.result() for f in futures]
    return outs, results


def _failed(results: list[LocalResult], outs: list[str], what: str) -> str | None:
    for i, (r, out) in enumerate(zip(results, outs)):
        if not os.path.exists(out):
            return (f"replay {'AB'[i]} wrote no {what} ({r.failure_kind or 'no optimizer step reached'}: "
                    f"{(r.error or r.stderr_tail)[-400:]})")
    return None


def localize_pair(spec_a: dict[str, Any], spec_b: dict[str, Any], *, step: int | None = None,
                  **options: Any) -> dict[str, Any]:
    """The first divergent step and op of two runs (``options`` go to :func:`run_local`: ``code_dir``,
    ``python``, ``device``). Returns a JSON-able dict: ``status`` (``localized``, ``identical``,
    ``failed``), ``step``, ``replays``, ``answer`` (the op, module, phase, line, cause) and ``sentence``."""
    for spec in (spec_a, spec_b):
        if spec.get("framework") not in ("torch", "tensorflow"):
            return {"status": "failed", "replays": 0, "step": None, "answer": None,
                    "sentence": "localization replays PyTorch (op by op) or Keras (layer by layer) training; "
                                f"this run's framework is {spec.get('framework')!r}"}
    replays = 0
    with tempfile.TemporaryDirectory(prefix="steady-localize-") as folder:
        if step is None:
            outs, results = _pair((spec_a, spec_b), "steps", 0, folder, **options)
            replays += 2
            if (why := _failed(results, outs, "step digests")) is not None:
                return {"status": "failed", "replays": replays, "step": None, "answer": None, "sentence": why}
            digests = [_read_digests(out) for out in outs]
            step = first_divergent_step(digests[0], digests[1])
            stopped = any(not r.ok for r in results)
            if stopped and step is not None and step >= min(len(d) for d in digests):
                step = None  # a replay was stopped or failed before the steps could be compared
            if step is None and stopped:
                bad = next(i for i, r in enumerate(results) if not r.ok)
                r = results[bad]
                return {"status": "failed", "replays": replays, "step": None, "answer": None,
                        "sentence": f"replay {'AB'[bad]} did not finish ({r.failure_kind}: "
                                    f"{(r.error or r.stderr_tail)[-400:]}) and the steps it recorded agree"}
            if step is None:
                return {"status": "identical", "replays": replays, "step": None, "answer": None,
                        "sentence": f"the replays' training state is identical at all {len(digests[0])} steps: "
                                    "nothing to localize (the divergence did not recur)"}
        outs, results = _pair((spec_a, spec_b), "trace", step, folder, **options)
        replays += 2
        if (why := _failed(results, outs, f"trace of step {step}")) is not None:
            return {"status": "failed", "replays": replays, "step": step, "answer": None, "sentence": why}
        traces = []
        for out in outs:
            with open(out, encoding="utf-8") as f:
                traces.append(json.load(f)["trace"])
    answer = first_divergent_op(traces[0], traces[1], step=step)
    if answer is None:
        return {"status": "identical", "replays": replays, "step": step, "answer": None,
                "sentence": f"every op of step {step} gave the same output in both replays ({len(traces[0])} ops): "
                            "the divergence did not recur"}
    return {"status": "localized", "replays": replays, "step": step, "answer": answer.to_dict(),
            "sentence": answer.sentence()}


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m steady.worker.agent.localize",
                                description="name the first op where two runs of a spec part")
    p.add_argument("spec_a")
    p.add_argument("spec_b")
    p.add_argument("--code", help="the unpacked code the runs start in")
    p.add_argument("--step", type=int, help="the first divergent step, when known (saves two replays)")
    p.add_argument("--device", help="the device the replays run on (as a worker's --device)")
    args = p.parse_args(argv)
    specs = []
    for path in (args.spec_a, args.spec_b):
        with open(path, encoding="utf-8") as f:
            specs.append(json.load(f))
    result = localize_pair(specs[0], specs[1], step=args.step, code_dir=args.code, device=args.device)
    print(json.dumps(result, indent=2))
    return 0 if result["status"] != "failed" else 1


if __name__ == "__main__":
    import sys

    sys.exit(main())
