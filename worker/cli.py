"""``steady worker`` (also ``python -m worker``): run a worker agent.

    steady worker --server http://host:8000 --token TOKEN [--labels a,b] [--device cuda:0]
                  [--concurrency 1] [--work-dir DIR]
                  [--study ID] [--exit-when-idle | --once | --max-runs N]

In a batch job (Slurm array task, Kubernetes Indexed Job pod) use ``--exit-when-idle``:
the agent leases runs until nothing in its scope (``--study``, or the whole queue) is
queued or still running elsewhere, then exits 0, so the job ends when the study does.

``--server`` and ``--token`` default to ``STEADY_SERVER`` and ``STEADY_TOKEN``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from worker.protocol import Label


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="steady worker", description="Lease and execute Steady runs.")
    p.add_argument("--server", default=os.environ.get("STEADY_SERVER"), help="server URL (env STEADY_SERVER)")
    p.add_argument("--token", default=os.environ.get("STEADY_TOKEN"), help="worker token (env STEADY_TOKEN)")
    p.add_argument("--labels", default="", help="comma-separated extra labels, besides the automatic ones")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (narrows CUDA_VISIBLE_DEVICES); default: auto")
    p.add_argument("--concurrency", type=int, default=1, help="runs executed at once (default 1)")
    p.add_argument("--work-dir", default=os.environ.get("STEADY_WORKER_DIR", ".steady/worker"), help="scratch directory for runs")
    p.add_argument("--name", default="", help="worker name (default host-pid)")
    p.add_argument("--grace", type=float, default=30.0, help="seconds a running run may take to finish on SIGTERM before it is released")
    p.add_argument("--poll-max", type=float, default=15.0, help="longest wait between polls of an empty queue (s)")
    p.add_argument("--max-runs", type=int, default=None, help="exit after this many runs")
    p.add_argument("--study", type=int, default=_env_int("STEADY_STUDY"),
                   help="lease only this study's runs (env STEADY_STUDY)")
    p.add_argument("--exit-when-idle", action="store_true",
                   default=os.environ.get("STEADY_EXIT_WHEN_IDLE", "").lower() in ("1", "true", "yes"),
                   help="exit once nothing in scope is queued or running elsewhere (batch jobs)")
    p.add_argument("--once", action="store_true", help="ask for one run, execute it if there is one, then exit")
    p.add_argument("--keep-run-dirs", action="store_true", help="keep each run's spec, events and output")
    p.add_argument("--health-file", default=None, help="file rewritten with the time of every poll")
    p.add_argument("--print-labels", action="store_true", help="print the automatic labels and fingerprint, then exit")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from worker.agent import Agent, AgentConfig

    labels = [x.strip() for x in args.labels.split(",") if x.strip()]
    if args.print_labels:
        import json

        from worker.fingerprint import auto_labels, host_fingerprint

        from worker.engine import detect

        job = detect()
        print(json.dumps({"labels": labels + auto_labels(args.device), "fingerprint": host_fingerprint(args.device),
                          "engine": job.model_dump() if job else None}, indent=2))
        return 0
    if not args.server or not args.token:
        print("steady worker: --server and --token (or STEADY_SERVER / STEADY_TOKEN) are required", file=sys.stderr)
        return 2
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(list[Label]).validate_python(labels)
    except ValidationError as exc:
        print(f"steady worker: invalid label: {exc}", file=sys.stderr)
        return 2
    config = AgentConfig(
        server=args.server, token=args.token, labels=labels, device=args.device,
        concurrency=args.concurrency, work_dir=args.work_dir, name=args.name, grace_s=args.grace,
        poll_max_s=args.poll_max, max_runs=args.max_runs, keep_run_dirs=args.keep_run_dirs,
        health_file=args.health_file, study_id=args.study, exit_when_idle=args.exit_when_idle, once=args.once,
    )
    agent = Agent(config)
    agent.install_signal_handlers()
    return agent.run()
