"""``steady worker`` (also ``python -m steady.worker``): run a worker agent.

    STEADY_TOKEN=... steady worker --server http://host:8000 [--token-file FILE] [--labels a,b]
                  [--device cuda:0] [--concurrency 1] [--work-dir DIR]
                  [--run-as USER] [--builtin-only] [--pass-env NAME,...]
                  [--study ID] [--exit-when-idle | --once | --max-runs N]

In a batch job (Slurm array task, Kubernetes Indexed Job pod) use ``--exit-when-idle``:
the agent leases runs until nothing in its scope (``--study``, or the whole queue) is
queued or still running elsewhere, then exits 0, so the job ends when the study does.

``--server`` defaults to ``STEADY_SERVER``. The worker token comes from ``STEADY_TOKEN`` or
``--token-file`` only, never from the command line (``/proc/<pid>/cmdline`` and ``ps`` show the
command line to every local user and to the runs). User code runs with an allow-listed
environment in its own directory and never sees this token (see docs/deploy.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from steady.worker.contract import codepack
from steady.worker.contract.protocol import Label


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isascii() and value.isdigit() else None


def read_token(token_file: str | None) -> str | None:
    """The worker token: the first line of ``token_file``, else ``STEADY_TOKEN``."""
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            return f.readline().strip() or None
    return os.environ.get("STEADY_TOKEN", "").strip() or None


def hide_from_environ(name: str) -> None:
    """Remove ``name`` from this process's environment, including the copy the kernel shows in
    ``/proc/<pid>/environ``: that file reads the process's original environment block, which
    ``unsetenv`` leaves untouched, so the value's bytes there are overwritten in place."""
    value = os.environ.get(name)
    if not value or not sys.platform.startswith("linux"):
        os.environ.pop(name, None)
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_void_p
        libc.getenv.argtypes = [ctypes.c_char_p]
        address = libc.getenv(name.encode())
        if address:
            raw = ctypes.string_at(address)
            ctypes.memset(address, ord("x"), len(raw))
    except (OSError, AttributeError):
        pass
    os.environ.pop(name, None)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="steady worker", description="Lease and execute Steady runs.")
    p.add_argument("--server", default=os.environ.get("STEADY_SERVER"), help="server URL (env STEADY_SERVER)")
    p.add_argument("--token", default=None, help=argparse.SUPPRESS)  # removed: refused with a pointer
    p.add_argument("--token-file", default=os.environ.get("STEADY_TOKEN_FILE"),
                   help="file holding the worker token (env STEADY_TOKEN_FILE; default: env STEADY_TOKEN)")
    p.add_argument("--run-as", default=os.environ.get("STEADY_RUN_AS") or None, metavar="USER",
                   help="run user code as this unprivileged user (the agent must run as root)")
    p.add_argument("--builtin-only", action="store_true",
                   default=os.environ.get("STEADY_BUILTIN_ONLY", "").lower() in ("1", "true", "yes"),
                   help="lease only runs of built-in workloads, never user code")
    p.add_argument("--pass-env", default=os.environ.get("STEADY_PASS_ENV", ""), metavar="NAME,...",
                   help="extra environment variables the runs inherit (default: PATH, LANG, LC_*, TZ, "
                        "CUDA_VISIBLE_DEVICES only)")
    p.add_argument("--labels", default="", help="comma-separated extra labels, besides the automatic ones")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (narrows CUDA_VISIBLE_DEVICES); default: auto")
    p.add_argument("--concurrency", type=int, default=1, help="runs executed at once (default 1)")
    p.add_argument("--work-dir", default=os.environ.get("STEADY_WORKER_DIR", ".steady/worker"), help="scratch directory for runs")
    p.add_argument("--name", default="", help="worker name (default host-pid)")
    p.add_argument("--grace", type=float, default=30.0, help="seconds a running run may take to finish on SIGTERM before it is released")
    p.add_argument("--report-timeout", type=float, default=10.0,
                   help="on SIGTERM, seconds after the grace the agent keeps trying to report or release its runs; "
                        "it exits within grace + this even when the server is gone (default 10)")
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
    from steady.worker.agent.loop import Agent, AgentConfig

    labels = [x.strip() for x in args.labels.split(",") if x.strip()]
    if args.print_labels:
        import json

        from steady.worker.contract.fingerprint import auto_labels, host_fingerprint

        from steady.worker.agent.engine import detect

        job = detect()
        print(json.dumps({"labels": labels + auto_labels(args.device), "fingerprint": host_fingerprint(args.device),
                          "engine": job.model_dump() if job else None}, indent=2))
        return 0
    if args.token is not None:
        print("steady worker: --token is no longer accepted: a token on the command line is visible to every "
              "local user and to the runs (ps, /proc/<pid>/cmdline). Set STEADY_TOKEN in the environment or "
              "pass --token-file FILE (mode 0600).", file=sys.stderr)
        return 2
    try:
        token = read_token(args.token_file)
    except OSError as exc:
        print(f"steady worker: cannot read --token-file: {exc}", file=sys.stderr)
        return 2
    if not args.server or not token:
        print("steady worker: --server (or STEADY_SERVER) and a worker token (STEADY_TOKEN or --token-file) "
              "are required", file=sys.stderr)
        return 2
    run_as = None
    if args.run_as:
        from steady.worker.agent.runner import RunAs

        try:
            run_as = RunAs.lookup(args.run_as)
        except ValueError as exc:
            print(f"steady worker: {exc}", file=sys.stderr)
            return 2
        if os.geteuid() != 0:
            print("steady worker: --run-as needs the agent to run as root (it switches user per run)", file=sys.stderr)
            return 2
        if args.token_file and run_as.can_read(args.token_file):
            print(f"steady worker: --token-file {args.token_file} is readable by the run user {run_as.name}, so "
                  "every run could read the worker token: chown it to root and chmod 600", file=sys.stderr)
            return 2
    hide_from_environ("STEADY_TOKEN")
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(list[Label]).validate_python(labels)
    except ValidationError as exc:
        print(f"steady worker: invalid label: {exc}", file=sys.stderr)
        return 2
    try:
        code_limits = codepack.Limits.from_env(os.environ)
    except codepack.CodeError as exc:
        print(f"steady worker: {exc}", file=sys.stderr)
        return 2
    config = AgentConfig(
        server=args.server, token=token, labels=labels, device=args.device,
        concurrency=args.concurrency, work_dir=args.work_dir, name=args.name, grace_s=args.grace,
        report_s=max(0.0, args.report_timeout),
        poll_max_s=args.poll_max, max_runs=args.max_runs, keep_run_dirs=args.keep_run_dirs,
        health_file=args.health_file, study_id=args.study, exit_when_idle=args.exit_when_idle, once=args.once,
        run_as=run_as, builtin_only=args.builtin_only,
        pass_env=tuple(x.strip() for x in args.pass_env.split(",") if x.strip()), code_limits=code_limits,
    )
    agent = Agent(config)
    agent.install_signal_handlers()
    return agent.run()
