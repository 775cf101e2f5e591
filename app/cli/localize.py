"""``steady localize STUDY [--runs A B]``: name the first op where two repeats of a study part.

The repeats are replayed here, where the user's code and framework are (the study's code is
fetched from the server and unpacked; each run's spec is the one its lease gave a worker), by the
worker's replay driver in a child process (``python -m steady.worker.agent.localize``: the server
side never imports the worker's agent). The answer is printed and kept on the server, where it
becomes part of the repeatability verdict (``steady report``, the API, the dashboard).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from steady.server.cli.support import EXIT_FAIL, EXIT_OK, CliError, client_opts, get_report
from steady.server.kit.terminal import printable

if TYPE_CHECKING:
    from steady.server.reports.models import Report


def diverging_pair(report: Report) -> tuple[int, int]:
    """Two repeats (same seed, determinism and stack) whose values differ: the first such pair of the
    report's repeatability verdicts, worst first as the report orders them."""
    for v in report.of_level("repeatability"):
        for seed in v.per_seed:
            if seed.verdict != "identical" and len(seed.run_ids) >= 2:
                return seed.run_ids[0], seed.run_ids[1]
    raise CliError(f"study {report.study.id} has no diverging repeats to localize: every seed's repeats are "
                   "identical (or have a single run)")


def _code(api: Any, sha256: str, dest: str) -> str:
    from steady.worker.contract.codepack import extract

    data = api.get_bytes(f"/api/v1/code/{sha256}")
    if hashlib.sha256(data).hexdigest() != sha256:
        raise CliError(f"the code archive fetched for {sha256[:12]} does not match its digest")
    extract(data, dest)
    return dest


def replay(api: Any, run_ids: tuple[int, int], *, step: int | None = None) -> dict[str, Any]:
    """Replay the two runs (here) and return the driver's answer."""
    specs = [api.get(f"/api/v1/runs/{r}/spec") for r in run_ids]
    with tempfile.TemporaryDirectory(prefix="steady-localize-") as folder:
        argv = [sys.executable, "-m", "steady.worker.agent.localize"]
        for i, spec in enumerate(specs):
            path = os.path.join(folder, f"spec-{i}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(spec, f)
            argv.append(path)
        if specs[0].get("code_sha256"):
            argv += ["--code", _code(api, specs[0]["code_sha256"], os.path.join(folder, "code"))]
        if step is not None:
            argv += ["--step", str(step)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise CliError(f"the replays did not finish (exit {done.returncode}): {done.stderr[-2000:]}") from None


def recorded_step(api: Any, run_ids: tuple[int, int]) -> tuple[int | None, int] | None:
    """(first divergent step or None, steps compared) from the step digests the runs recorded
    (a study with ``localize: steps``); None when they recorded none."""
    from steady.server.cli.client import ApiError
    from steady.worker.contract.oplocate import STEP_DIGEST_KEY, recorded_divergence

    series = []
    for run_id in run_ids:
        try:
            s = api.get(f"/api/v1/runs/{run_id}/metrics/{STEP_DIGEST_KEY}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        series.append(dict(zip(s["steps"], s["values"])))
    return recorded_divergence(series[0], series[1])


def request_job(api: Any, study_id: int, pair: tuple[int, int]) -> dict[str, Any]:
    """Ask a worker to localize the pair: the localization job the dashboard's Localize button requests
    (``POST /api/v1/studies/{id}/localization-jobs``); the server's refusal is an ``ApiError``."""
    return api.post(f"/api/v1/studies/{study_id}/localization-jobs", json={"runs": list(pair)})


def job_state(job: dict[str, Any]) -> str:
    """Where a localization job stands, in the study page's words."""
    status = job["status"]
    if status == "pending":
        known = f" (step {job['step']} is known from the recorded digests: two replays)" \
            if job.get("step") is not None else ""
        return f"waiting for a worker{known}"
    if status == "running":
        return f"replaying on worker {job.get('worker_name') or job.get('worker_id')}" + \
            (f" (attempt {job['attempt']})" if job.get("attempt", 1) > 1 else "")
    if status == "done" and job.get("result"):
        return job["result"]["sentence"]
    return f"{status}: {job['error']}" if job.get("error") else status


def follow_job(api: Any, job: dict[str, Any], *, seconds: float, poll: float, say: Any,
               clock: Any = time.monotonic) -> dict[str, Any]:
    """Poll the job until it ends or ``seconds`` pass, calling ``say`` with each new state; the job as last read
    (its status still pending or running when the time ran out)."""
    from steady.worker.contract.protocol import LocalizationStatus

    deadline, last = clock() + seconds, ""
    while True:
        line = job_state(job)
        if line != last:
            say(f"localization job {job['id']}: runs {job['run_ids'][0]} and {job['run_ids'][1]}: {line}")
            last = line
        if job["status"] in LocalizationStatus.TERMINAL or clock() >= deadline:
            return job
        time.sleep(max(0.0, min(poll, deadline - clock())))
        job = api.get(f"/api/v1/localization-jobs/{job['id']}")


def cmd_localize(args: argparse.Namespace) -> int:
    from steady.server.cli.client import Api

    api = Api(args.server, args.token)
    run_ids = tuple(args.runs) if args.runs else diverging_pair(get_report(api, args.study))
    pair = (int(run_ids[0]), int(run_ids[1]))
    step = args.step
    recorded = recorded_step(api, pair) if step is None else None
    if recorded is not None and recorded[0] is None:
        body = {"run_ids": list(pair), "status": "identical", "step": None, "replays": 0, "answer": None,
                "sentence": f"the runs' training state was identical at all {recorded[1]} steps they recorded: "
                            "they differ outside it (what was logged, evaluation), not in training"}
        api.post(f"/api/v1/studies/{args.study}/localizations", json=body)
        print(json.dumps(body, indent=2) if args.json else f"runs {pair[0]} and {pair[1]}: {body['sentence']}")
        return EXIT_OK
    if recorded is not None:
        step = recorded[0]
        print(f"the runs' recorded step digests part at step {step}", file=sys.stderr)
    print(f"replaying runs {pair[0]} and {pair[1]} of study {args.study}...", file=sys.stderr, flush=True)
    result = replay(api, pair, step=step)
    body = {"run_ids": list(pair), "status": result["status"], "step": result.get("step"),
            "replays": result.get("replays", 0), "answer": result.get("answer"), "sentence": result["sentence"]}
    api.post(f"/api/v1/studies/{args.study}/localizations", json=body)
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        print(f"runs {pair[0]} and {pair[1]}: {printable(result['sentence'])}")
        print(f"({result.get('replays', 0)} replays; kept in the study's report)")
    return EXIT_OK if result["status"] != "failed" else EXIT_FAIL


def register(sub: Any) -> None:
    p = sub.add_parser("localize", help="name the first op where two repeats of a study part (replays them here)")
    client_opts(p)
    p.add_argument("study", type=int)
    p.add_argument("--runs", type=int, nargs=2, metavar=("A", "B"),
                   help="the two repeats (default: the first diverging pair of the report)")
    p.add_argument("--step", type=int, help="the first divergent step, when known (two replays instead of four; "
                   "a study with `localize: steps` records it)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_localize)
