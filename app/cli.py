"""The one CLI, ``steady``: serve, worker, submit, status, report, demo, token, migrate, calibrate.

Imports are lazy per command: ``steady worker`` on a GPU box imports neither FastAPI nor
SQLAlchemy, and ``steady submit`` needs only the HTTP client.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from app.terminal import printable

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _server_settings(args: argparse.Namespace):  # noqa: ANN202
    for flag, env in (("data_dir", "STEADY_DATA_DIR"), ("database_url", "STEADY_DATABASE_URL")):
        value = getattr(args, flag, None)
        if value:
            os.environ[env] = str(value)
    from app.config import Settings

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
        from app.main import SUPERVISOR_PID_ENV

        # the worker processes end when this supervisor dies, even by SIGKILL (app.main)
        os.environ[SUPERVISOR_PID_ENV] = str(os.getpid())
    uvicorn.run(
        "app.main:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
    )
    return EXIT_OK


def cmd_migrate(args: argparse.Namespace) -> int:
    from app import migrate
    from app.db import Database

    settings = _server_settings(args)
    db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
    migrate.upgrade(db.engine)
    print(f"database at revision {migrate.current_revision(db.engine)}")
    return EXIT_OK


def cmd_token(args: argparse.Namespace) -> int:
    from app import migrate
    from app.auth import service
    from app.db import Database

    settings = _server_settings(args)
    db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
    migrate.upgrade(db.engine)
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
            row = service.revoke_token(session, args.id)
        if row is None:
            print(f"no token {args.id}", file=sys.stderr)
            return EXIT_FAIL
        print(f"revoked token {args.id}")
    return EXIT_OK


def _load_spec(path: str) -> dict[str, Any]:
    import yaml

    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise SystemExit(f"steady: {path}: a study spec is a mapping (YAML or JSON object)")
    return data


def _bar(p: dict[str, int], width: int = 30) -> str:
    total = max(p.get("total", 0), 1)
    done = p.get("completed", 0) + p.get("failed", 0) + p.get("cancelled", 0)
    filled = int(width * done / total)
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {done}/{p.get('total', 0)} runs"
        f"  running {p.get('running', 0)}  failed {p.get('failed', 0)}"
    )


def wait_for(api, study_id: int, *, interval: float = 1.0, stream=sys.stderr) -> dict[str, Any]:  # noqa: ANN001
    """Poll a study until it ends, drawing a progress bar; returns the final study."""
    tty = stream.isatty()
    last = ""
    while True:
        study = api.get(f"/api/v1/studies/{study_id}")
        line = f"study {study_id} {study['status']:<9} {_bar(study['progress'])}"
        if tty:
            stream.write("\r" + line.ljust(len(last)))
        elif line != last:
            stream.write(line + "\n")
        stream.flush()
        last = line
        if study["status"] in {"completed", "failed", "cancelled"}:
            if tty:
                stream.write("\n")
            return study
        time.sleep(interval)


def cmd_submit(args: argparse.Namespace) -> int:
    from app.cli_client import Api

    api = Api(args.server, args.token)
    spec = _load_spec(args.spec)
    study = api.post("/api/v1/studies", json=spec)
    print(f"submitted study {study['id']} ({printable(study['name'])}): {study['progress']['total']} runs")
    if not args.wait:
        return EXIT_OK
    final = wait_for(api, study["id"])
    return EXIT_OK if final["status"] == "completed" else EXIT_FAIL


def cmd_status(args: argparse.Namespace) -> int:
    from app.cli_client import Api

    api = Api(args.server, args.token)
    if args.study is not None:
        studies = [api.get(f"/api/v1/studies/{args.study}")]
    else:
        studies = api.get("/api/v1/studies", params={"limit": args.limit})["items"]
    if args.json:
        print(json.dumps(studies, indent=2))
        return EXIT_OK
    if not studies:
        print("no studies yet: steady submit study.yaml")
    for s in studies:
        print(f"{s['id']:>5}  {s['status']:<9} {_bar(s['progress'], 20)}  {printable(s['name'])}")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from app.cli_client import Api
    from app.reports.render import render_report

    api = Api(args.server, args.token)
    report = api.get(f"/api/v1/studies/{args.study}/report")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        print(render_report(report, color=color))
    return EXIT_OK


def cmd_alerts(args: argparse.Namespace) -> int:
    from app.cli_client import Api

    api = Api(args.server, args.token)
    if args.alerts_cmd == "ack":
        alert = api.post(f"/api/v1/alerts/{args.id}/ack")
        print(f"alert {alert['id']} acknowledged by {alert['acked_by']}")
        return EXIT_OK
    params = {k: v for k, v in (("state", args.state), ("suite", args.suite), ("study_id", args.study),
                                 ("limit", args.limit)) if v is not None}
    page = api.get("/api/v1/alerts", params=params)
    if args.json:
        print(json.dumps(page["items"], indent=2))
        return EXIT_OK
    if not page["items"]:
        print("no alerts")
    for a in page["items"]:
        ack = " (acked)" if a["acked_at"] else ""
        print(f"{a['id']:>5}  {a['state']:<8} {a['severity']:<8} {a['kind']:<18} {printable(a['summary'])}{ack}\n"
              f"       {a['link']}")
    return EXIT_FAIL if args.fail_on_firing and any(a["state"] == "firing" for a in page["items"]) else EXIT_OK


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Measure every decision rule's false-alarm rate and power by simulation (pure, no server)."""
    import numpy as np

    from app.stats.calibration import table
    from app.stats.calibration.rules import all_rules, rule_by_name

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
    if args.json:
        doc = table.to_json(rows, sims=args.sims, planted_sims=args.planted_sims or args.sims, seed=args.seed,
                            command=command)
        if power:
            doc["oob_power_offsets"] = power
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2))
    if args.update_doc:
        path = Path(args.update_doc)
        text = table.update_doc(path.read_text(), table.format_markdown(rows))
        if power:
            text = table.update_doc(text, table.format_power_markdown(power), start=table.POWER_START,
                                    end=table.POWER_END)
        path.write_text(text)
    above = [r for _, _, r in rows if r.kind == "healthy" and table.exceeds_nominal(r)]
    return EXIT_FAIL if above else EXIT_OK


def cmd_worker(argv: list[str]) -> int:
    from worker.cli import main as worker_main

    return worker_main(argv)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.controls:
        from app.demo.controls import main

        return main(args)
    from app.demo.run import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="steady", description="Is my training stable?")
    sub = parser.add_subparsers(dest="command", required=True)

    def server_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", help="where the embedded database lives (STEADY_DATA_DIR, default .steady)")
        p.add_argument("--database-url", help="SQLAlchemy URL, e.g. postgresql+psycopg://… (STEADY_DATABASE_URL)")

    def client_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--server", help=f"server URL (STEADY_SERVER, default http://127.0.0.1:8000)")
        p.add_argument("--token", help="API token (STEADY_TOKEN, or the file .steady/token)")

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
    c.add_argument("--role", required=True, choices=["admin", "user", "worker"])
    c.add_argument("--name")
    c.add_argument("--save", action="store_true", help="also write it to <data-dir>/token for the CLI")
    c.add_argument("--quiet", "-q", action="store_true", help="print only the token")
    tsub.add_parser("list")
    r = tsub.add_parser("revoke")
    r.add_argument("id", type=int)
    p.set_defaults(func=cmd_token)

    p = sub.add_parser("submit", help="submit a study spec (YAML or JSON)")
    client_opts(p)
    p.add_argument("spec", help="path to the spec, or - for stdin")
    p.add_argument("--wait", action="store_true", help="show progress until the study ends")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", help="studies and their progress")
    client_opts(p)
    p.add_argument("study", nargs="?", type=int)
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("report", help="the stability report of a study")
    client_opts(p)
    p.add_argument("study", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("alerts", help="alerts: list (default) or acknowledge")
    client_opts(p)
    asub = p.add_subparsers(dest="alerts_cmd")
    ls = asub.add_parser("list")
    for q in (p, ls):
        q.add_argument("--state", choices=["firing", "resolved"])
        q.add_argument("--suite")
        q.add_argument("--study", type=int)
        q.add_argument("--limit", type=int, default=50)
        q.add_argument("--json", action="store_true")
        q.add_argument("--fail-on-firing", action="store_true", help="exit 1 when a listed alert is firing (for CI)")
    ack = asub.add_parser("ack")
    ack.add_argument("id", type=int)
    p.set_defaults(func=cmd_alerts)

    p = sub.add_parser("demo", help="serve, run a local worker, run the bundled demo study, print its report")
    p.add_argument("--data-dir", default=os.environ.get("STEADY_DATA_DIR", ".steady-demo"))
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--exit", action="store_true", help="stop the server after the report instead of serving on")
    p.add_argument("--quick", action="store_true", help="a smaller study (for tests)")
    p.add_argument("--controls", action="store_true",
                   help="instead: the planted controls (one source of nondeterminism each), judged without a server")
    p.add_argument("--variants", action="store_true", help="with --controls: also the reference itself and the other data-order plants")
    p.add_argument("--overlaps", action="store_true", help="with --controls: also controls with two planted sources")
    p.add_argument("--keras", action="store_true", help="with --controls: also the Keras controls")
    p.add_argument("--device", default="cpu", help="with --controls: device of the kernel control (cpu, cuda)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("calibrate", help="measure each decision rule's false-alarm rate and power by simulation")
    p.add_argument("--sims", type=int, default=200, help="simulated studies per scenario (default 200)")
    p.add_argument("--planted-sims", type=int, default=None, help="simulations per planted scenario (default --sims)")
    p.add_argument("--rule", action="append", help="only this rule (repeatable); default: every rule")
    p.add_argument("--seed", type=int, default=20260101, help="seed of the numpy Generator")
    p.add_argument("--json", metavar="OUT", help="also write the table as JSON to OUT")
    p.add_argument("--power-sims", type=int, default=0,
                   help="also measure the out-of-band 80%%-power offsets for 5/10/20 seeds (this many sims each)")
    p.add_argument("--update-doc", metavar="MD", help="rewrite the table block of this markdown file (docs/calibration.md)")
    p.add_argument("--progress", action="store_true", help="print each scenario's count to stderr as it finishes")
    p.set_defaults(func=cmd_calibrate)

    sub.add_parser("worker", help="run a worker agent (steady worker --help)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "worker":
        return cmd_worker(argv[1:])
    args = build_parser().parse_args(argv)
    from app.cli_client import ApiError

    try:
        return args.func(args)
    except ApiError as exc:
        detail = exc.detail
        if isinstance(detail, list):
            detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
        detail = printable(detail)
        print(f"steady: {detail}" if exc.status == 0 else f"steady: the server answered {exc.status}: {detail}",
              file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
