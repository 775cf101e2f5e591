"""``steady fleet check``: which worker of a pool computes differently? Submits a fleet check (a study whose runs
are pinned to workers, ``steady.server.studies.fleet``), waits for it, prints its report; exits as ``steady check``
does (0 pass, 1 fail, 2 inconclusive, 3 could not judge)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from steady.server.cli.support import (EXIT_CANNOT_JUDGE, EXIT_INTERRUPTED, CliError, client_opts, code_opts,
                                      load_spec)

CANARY = {"framework": "torch", "name": "fleet_canary"}


def fleet_spec(*, workload: str, labels: list[str], workers: list[str] | None, repeats: int,
               wait_s: float | None, plan_one_in: int | None) -> dict[str, Any]:
    """The study spec of a fleet check: the built-in canary, or the workload (and code) of a spec file, at strict."""
    fleet: dict[str, Any] = {"repeats": repeats, "labels": labels}
    if workers:
        fleet["workers"] = workers
    if wait_s is not None:
        fleet["wait_s"] = wait_s
    if plan_one_in is not None:
        fleet["plan_one_in"] = plan_one_in
    if workload == "canary":
        return {"name": "fleet check (canary)", "workload": dict(CANARY), "seeds": [0], "determinism": ["strict"],
                "metrics": ["loss"], "threads": 1, "fleet": fleet}
    spec = load_spec(workload)
    seeds = spec.get("seeds") or [0]
    for key in ("seeds", "repeats", "determinism", "stacks", "arms", "budget", "sources", "resume"):
        spec.pop(key, None)
    return {**spec, "name": spec.get("name") or "fleet check", "seeds": seeds[:1], "determinism": ["strict"],
            "fleet": fleet}


def _labels(pairs: list[str]) -> list[str]:
    for p in pairs:
        if not p.strip():
            raise CliError("--labels: an empty label")
    return [p.strip() for p in pairs]


def cmd_fleet_check(args: argparse.Namespace) -> int:
    from steady.server.cli.client import Api, wait_for
    from steady.server.cli.code import ship_options
    from steady.server.cli.render import render_report
    from steady.server.cli.support import get_report, verdict_exit_code

    labels = _labels([x for arg in args.labels for x in arg.split(",")])
    spec = fleet_spec(workload=args.workload, labels=labels, workers=args.workers or None, repeats=args.repeats,
                      wait_s=args.wait_s, plan_one_in=args.plan_one_in)
    api = Api(args.server, args.token)
    if args.workload != "canary":
        ship_options(args, api, spec, args.workload)
    study = api.post("/api/v1/studies", json=spec)
    sid = study["id"]
    pool = [w["name"] for w in (study.get("spec", {}).get("fleet") or {}).get("pool") or []]
    print(f"fleet check {sid}: {study['progress']['total']} runs on {len(pool) or 'the'} workers "
          f"({', '.join(pool)})" if pool else f"fleet check {sid}: {study['progress']['total']} runs", flush=True)
    try:
        final = wait_for(api, sid)
    except KeyboardInterrupt:
        print(f"\nsteady: stopped waiting; fleet check {sid} keeps running (`steady report {sid}`; "
              f"`steady cancel {sid}` stops it)", file=sys.stderr)
        return EXIT_INTERRUPTED
    if final["status"] == "cancelled":
        print(f"steady: fleet check {sid} was cancelled: nothing to judge", file=sys.stderr)
        return EXIT_CANNOT_JUDGE
    report = get_report(api, sid)
    print(render_report(report, color=sys.stdout.isatty()))
    return verdict_exit_code(report)


def register(sub: Any) -> None:
    """Add ``fleet check`` to ``steady``'s subcommands (``sub``)."""
    p = sub.add_parser("fleet", help="fleet checks: which worker computes differently? (`steady fleet check`)")
    fleet_sub = p.add_subparsers(dest="fleet_command", required=True, metavar="SUBCOMMAND")
    c = fleet_sub.add_parser("check", help="run one workload on every worker of a pool, several times each, and "
                             "name the workers whose runs part from their peers'; exit 0 pass, 1 fail, "
                             "2 inconclusive (errors: 3)")
    client_opts(c)
    c.add_argument("--labels", action="append", default=[], metavar="K=V",
                   help="only workers carrying these labels (comma-separated or repeated), e.g. pool=a100")
    c.add_argument("--workers", nargs="+", metavar="NAME", help="only these workers, by name")
    c.add_argument("--repeats", type=int, default=3, help="runs per worker (default 3)")
    c.add_argument("--workload", default="canary",
                   help="'canary' (built in, torch on CPU or GPU) or a study spec file whose workload (and code) "
                        "runs at strict; its seeds, determinism and stacks are replaced")
    c.add_argument("--wait-s", type=float, default=None, dest="wait_s",
                   help="a worker that has not taken its runs this many seconds after submission is reported "
                        "as not run (default 1800)")
    c.add_argument("--plan-one-in", type=int, default=None, dest="plan_one_in", metavar="K",
                   help="also plan the repeats per worker that see a fault in 1 of K steps with probability 0.95")
    code_opts(c)
    c.set_defaults(func=cmd_fleet_check, error_exit=EXIT_CANNOT_JUDGE)
