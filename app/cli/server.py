"""``steady`` commands that run on the server's machine: serve, migrate, token, calibrate, demo."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from steady.server.cli.support import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    server_opts,
)
from steady.server.kit.terminal import printable


def _server_settings(args: argparse.Namespace):
    for flag, env in (("data_dir", "STEADY_DATA_DIR"), ("database_url", "STEADY_DATABASE_URL")):
        value = getattr(args, flag, None)
        if value:
            os.environ[env] = str(value)
    from steady.server.kit.config import Settings

    return Settings()


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    if args.public_dashboard:
        os.environ["STEADY_PUBLIC_DASHBOARD"] = "true"
    os.environ["STEADY_HOST"], os.environ["STEADY_PORT"] = args.host, str(args.port)
    settings = _server_settings(args)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    where = settings.database_url.split("@")[-1] if settings.database_url else settings.resolved_database_url
    print(f"steady: serving on http://{args.host}:{args.port}  (database: {where})", flush=True)
    if args.workers > 1:
        from steady.server.web.main import SUPERVISOR_PID_ENV

        # the worker processes end when this supervisor dies, even by SIGKILL (steady.server.web.main)
        os.environ[SUPERVISOR_PID_ENV] = str(os.getpid())
    uvicorn.run(
        "steady.server.web.main:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
    )
    return EXIT_OK


def cmd_migrate(args: argparse.Namespace) -> int:
    from steady.server.kit import migrate
    from steady.server.kit.db import Database

    settings = _server_settings(args)
    db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
    migrate.upgrade(db.engine)
    print(f"database at revision {migrate.current_revision(db.engine)}")
    return EXIT_OK


DATABASE_HINT = "point at the server's with --data-dir / STEADY_DATA_DIR or --database-url / STEADY_DATABASE_URL"


def _existing_database(settings):
    """The server's database, upgraded to head; refuses to create one where none exists."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError

    from steady.server.kit import migrate
    from steady.server.kit.db import Database

    url = make_url(settings.resolved_database_url)
    where = url.render_as_string(hide_password=True)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        where = url.database
        if not Path(url.database).is_file():
            raise CliError(f"no Steady database at {where}: {DATABASE_HINT}")
    db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
    try:
        if migrate.current_revision(db.engine) is None:
            raise CliError(f"{where} holds no Steady database: {DATABASE_HINT}")
        migrate.upgrade(db.engine)
    except DBAPIError as exc:
        problem = " ".join(str(getattr(exc, "orig", exc)).split())
        raise CliError(f"cannot open the database {where}: {problem}") from None
    return db


def cmd_token(args: argparse.Namespace) -> int:
    from steady.server.kit import migrate
    from steady.server.kit import auth as service
    from steady.server.kit.db import Database

    settings = _server_settings(args)
    if args.token_cmd == "create":  # the first token may come before the first `steady serve`
        db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
        migrate.upgrade(db.engine)
    else:
        db = _existing_database(settings)
    if args.token_cmd == "create":
        with db.write() as session:
            row, secret = service.create_token(session, name=args.name or f"{args.role}-token", role=service.Role(args.role))
            token_id = row.id
        if args.save:
            path = settings.data_dir / "token"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(secret + "\n")
            path.chmod(0o600)
            print(f"saved to {path}", file=sys.stderr)
        print(secret if args.quiet else f"token {token_id} ({args.role}): {secret}\n(shown once: store it now)")
    elif args.token_cmd == "list":
        with db.read() as session:
            for row in service.list_tokens(session):
                state = "revoked" if row.revoked_at else "active"
                print(f"{row.id:>4}  {row.role:<7} {row.prefix}…  {state:<8} {printable(row.name)}")
    elif args.token_cmd == "revoke":
        with db.write() as session:
            revoked = service.revoke_token(session, args.id)
        if revoked is None:
            print(f"no token {args.id}", file=sys.stderr)
            return EXIT_FAIL
        print(f"revoked token {args.id}")
    return EXIT_OK


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Measure every decision rule's false-alarm rate and power by simulation (pure, no server)."""
    import numpy as np

    from steady.server.stats.calibration import table
    from steady.server.stats.calibration.rules import all_rules, rule_by_name

    try:
        rules = [rule_by_name(n) for n in args.rule] if args.rule else all_rules()
    except KeyError as exc:
        print(f"steady calibrate: {exc.args[0]}", file=sys.stderr)
        return EXIT_USAGE
    rng = np.random.default_rng(args.seed)
    rows = table.run_table(rules, sims=args.sims, rng=rng, planted_sims=args.planted_sims,
                           progress=(lambda r: print(f"  {r.rule} / {r.scenario}: {r.k}/{r.n}", file=sys.stderr,
                                                     flush=True)) if args.progress else None)
    print(table.format_text(rows))
    command = "steady calibrate " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["calibrate"] else "steady calibrate"
    power = table.power_offsets(rng=rng, sims=args.power_sims) if args.power_sims else None
    if power:
        print(table.format_power_markdown(power))
    blowup = table.late_blowup_rows(rng=rng, sims=args.power_sims) if args.power_sims else None
    if blowup:
        print(table.format_blowup_markdown(blowup))
    shift = table.shift_power_rows(rng=rng, sims=args.power_sims) if args.power_sims else None
    if shift:
        print(table.format_shift_power_markdown(shift))
    if args.json:
        doc = table.to_json(rows, sims=args.sims, planted_sims=args.planted_sims or args.sims, seed=args.seed,
                            command=command)
        if power:
            doc["oob_power_offsets"] = power
        if blowup:
            doc["late_blowup_power"] = blowup
        if shift:
            doc["suite_shift_power"] = shift
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2))
    if args.update_doc:
        path = Path(args.update_doc)
        start, end = table.block_markers(args.doc_block) if args.doc_block else (table.DOC_START, table.DOC_END)
        text = table.update_doc(path.read_text(), table.format_markdown(rows), start=start, end=end)
        if power:
            text = table.update_doc(text, table.format_power_markdown(power), start=table.POWER_START,
                                    end=table.POWER_END)
        if blowup:
            text = table.update_doc(text, table.format_blowup_markdown(blowup), start=table.BLOWUP_START,
                                    end=table.BLOWUP_END)
        if shift:
            text = table.update_doc(text, table.format_shift_power_markdown(shift), start=table.SHIFT_POWER_START,
                                    end=table.SHIFT_POWER_END)
        path.write_text(text)
    above = [r for _, _, r in rows if r.kind == "healthy" and table.exceeds_nominal(r)]
    return EXIT_FAIL if above else EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    if args.controls and getattr(args, "distributed", False):
        from steady.server.cli.demo.distributed_controls import main as distributed_main

        return distributed_main(args)
    if args.controls and getattr(args, "fleet", False):
        from steady.server.cli.demo.fleet_controls import main as fleet_main

        return fleet_main(args)
    if args.controls and getattr(args, "resume", False):
        from steady.server.cli.demo.resume_controls import main as resume_main

        return resume_main(args)
    if args.controls:
        from steady.server.cli.demo.controls import main

        return main(args)
    from steady.server.cli.demo.run import run_demo

    return run_demo(args)


def register(sub: Any) -> None:
    """Add serve, migrate, token, demo and calibrate to ``steady``'s subcommands (``sub``)."""
    p = sub.add_parser("serve", help="run the API server and dashboard")
    server_opts(p)
    p.add_argument("--host", default=os.environ.get("STEADY_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("STEADY_PORT", "8000")))
    p.add_argument("--workers", type=int, default=1, help="API processes (use PostgreSQL for more than one)")
    p.add_argument("--public-dashboard", action="store_true", help="dashboard readable without a token")
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("migrate", help="upgrade the database schema to this version")
    server_opts(p)
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("token", help="manage API tokens (on the server's database)")
    server_opts(p)
    tsub = p.add_subparsers(dest="token_cmd", required=True)
    c = tsub.add_parser("create")
    server_opts(c)
    c.add_argument("--role", required=True, choices=["admin", "user", "worker"])
    c.add_argument("--name")
    c.add_argument("--save", action="store_true", help="also write it to <data-dir>/token for the CLI")
    c.add_argument("--quiet", "-q", action="store_true", help="print only the token")
    server_opts(tsub.add_parser("list"))
    r = tsub.add_parser("revoke")
    server_opts(r)
    r.add_argument("id", type=int)
    p.set_defaults(func=cmd_token)

    p = sub.add_parser("demo", help="serve, run a local worker, run the bundled demo study, print its report")
    p.add_argument("--data-dir", default=os.environ.get("STEADY_DATA_DIR", ".steady-demo"))
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--exit", action="store_true", help="stop the server after the report instead of serving on")
    p.add_argument("--quick", action="store_true", help="a smaller study (for tests)")
    p.add_argument("--sources", action="store_true",
                   help="instead: where does the variance come from? One arm per source (init, data order, "
                   "dropout/augmentation, numerics, a one-ULP change), the table against all sources (docs/sources.md)")
    p.add_argument("--runs", type=int, default=32,
                   help="with --sources: runs per arm in the first stage, and added per stage (default 32)")
    p.add_argument("--first-seed", type=int, default=0,
                   help="with --sources: the first seed (a repeated demo with fresh seeds checks the table's claims)")
    p.add_argument("--max-runs", type=int, default=224,
                   help="with --sources: the most runs per arm; the arms of undecided sources grow in stages until "
                   "each source's TOST decides or this is reached (default 224, 7 stages; equal to --runs: one fixed stage)")
    p.add_argument("--minutes", type=float, default=27.0,
                   help="with --sources: a time budget; no next stage starts that would end more than this many minutes "
                   "after the first began, and the sources still undecided are reported as stopped (default 27, so "
                   "the table is printed within 30 minutes; 0: none)")
    p.add_argument("--numpy", action="store_true",
                   help="with --sources: the NumPy twin of the model (numpy_sources: half the CPU per run, no PyTorch "
                   "start-up; its one-ULP and numerics arms reach the band later, docs/sources.md)")
    p.add_argument("--controls", action="store_true",
                   help="instead: the planted controls (one source of nondeterminism each), judged without a server")
    p.add_argument("--variants", action="store_true", help="with --controls: also the reference itself and the other data-order plants")
    p.add_argument("--overlaps", action="store_true", help="with --controls: also controls with two planted sources")
    p.add_argument("--keras", action="store_true", help="with --controls: also the Keras controls")
    p.add_argument("--resume", action="store_true",
                   help="with --controls: instead, the resume check's planted omissions (one piece of state each)")
    p.add_argument("--distributed", action="store_true",
                   help="with --controls: instead, the distributed controls (3 and 4 local processes, gloo on CPU)")
    p.add_argument("--fleet", action="store_true",
                   help="with --controls: instead, the planted faults of a fleet check (4 healthy local workers and "
                   "one faulty one per kind of fault, one server)")
    p.add_argument("--checks", type=int, default=5, help="with --controls --fleet: fleet checks per kind of fault")
    p.add_argument("--seeds", type=int, default=5, help="with --controls --resume or --distributed: seeds per control")
    p.add_argument("--only", action="append", metavar="TEXT",
                   help="with --controls --resume, --distributed or --fleet: only the controls whose name holds TEXT (repeatable)")
    p.add_argument("--device", default="cpu", help="with --controls: device of the kernel control (cpu, cuda)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("calibrate", help="measure each decision rule's false-alarm rate and power by simulation")
    p.add_argument("--sims", type=int, default=200, help="simulated studies per scenario (default 200)")
    p.add_argument("--planted-sims", type=int, default=None, help="simulations per planted scenario (default --sims)")
    p.add_argument("--rule", action="append", help="only this rule (repeatable); default: every rule")
    p.add_argument("--seed", type=int, default=20260101, help="seed of the numpy Generator")
    p.add_argument("--json", metavar="OUT", help="also write the table as JSON to OUT")
    p.add_argument("--power-sims", type=int, default=0,
                   help="also measure the out-of-band 80%%-power offsets for 5/10/20 seeds, the late blow-ups and the "
                   "suite-shift power before/after estimating dependence (this many sims each)")
    p.add_argument("--update-doc", metavar="MD", help="rewrite the table block of this markdown file (results/calibration.md)")
    p.add_argument("--doc-block", metavar="NAME",
                   help="with --update-doc: rewrite the block between <!-- calibration-table:NAME:start/end --> "
                        "instead of the full table (for a table of the --rule rules only)")
    p.add_argument("--progress", action="store_true", help="print each scenario's count to stderr as it finishes")
    p.set_defaults(func=cmd_calibrate)
