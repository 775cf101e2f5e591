"""The one CLI, ``steady``: serve, worker, launch, login, submit, check, status, cancel, report, compare, demo,
token, migrate, calibrate.

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

from app import __version__
from app.cli_support import (
    EXIT_BROKEN_PIPE,
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    failing_verdicts,
    load_spec,
    table,
    verdict_exit_code,
)
from app.terminal import printable


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
        proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
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


DATABASE_HINT = "point at the server's with --data-dir / STEADY_DATA_DIR or --database-url / STEADY_DATABASE_URL"


def _existing_database(settings):  # noqa: ANN001, ANN202
    """The server's database, upgraded to head; refuses to create one where none exists."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError

    from app import migrate
    from app.db import Database

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
    from app import migrate
    from app.auth import service
    from app.db import Database

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
            row = service.revoke_token(session, args.id)
        if row is None:
            print(f"no token {args.id}", file=sys.stderr)
            return EXIT_FAIL
        print(f"revoked token {args.id}")
    return EXIT_OK


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

    from app.cli_code import ship

    spec = load_spec(args.spec)
    api = Api(args.server, args.token)
    if not args.no_code and "code" not in spec:
        code = ship(api, spec, args.spec, code_dir=args.code, max_mb=args.max_code_mb)
        if code is not None:
            spec["code"] = code
    study = api.post("/api/v1/studies", json=spec)
    sid = study["id"]
    print(f"submitted study {sid} ({printable(study['name'])}): {study['progress']['total']} runs", flush=True)
    if not args.wait:
        return EXIT_OK
    if study["status"] == "open":  # an external study: its runs are uploaded, nothing runs here
        print(f"steady: study {sid} is external: nothing to wait for; upload its runs to"
              f" POST /api/v1/studies/{sid}/runs, then `steady report {sid}`", file=sys.stderr)
        return EXIT_OK
    try:
        final = wait_for(api, sid)
    except KeyboardInterrupt:
        print(f"\nsteady: stopped waiting; study {sid} keeps running: follow it with `steady status {sid}`"
              f" or open {api.server}/studies/{sid} (`steady cancel {sid}` stops it)", file=sys.stderr)
        return EXIT_INTERRUPTED
    if final.get("status_reason"):
        print(f"steady: study {sid}: {printable(final['status_reason'])}", file=sys.stderr)
    if final["status"] != "completed":
        failed = api.get(f"/api/v1/studies/{sid}/runs", params={"status": "failed", "limit": 1})["items"]
        if failed:
            r = failed[0]
            print(f"steady: run {r['id']} failed ({r.get('failure_kind') or 'error'}): {_first_line(r.get('error'))}"
                  f" — `steady logs {r['id']}` shows its stderr", file=sys.stderr)
        print(f"steady: study {sid} {final['status']}: `steady runs {sid}`, dashboard {api.server}/studies/{sid}",
              file=sys.stderr)
        return EXIT_FAIL
    return _verdict_summary(api.get(f"/api/v1/studies/{sid}/report"), sid)


def _first_line(text: str | None) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return printable(lines[0][:200]) if lines else ""


def cmd_runs(args: argparse.Namespace) -> int:
    """A study's runs: id, status, attempt, seed, level, the first line of the error."""
    from app.cli_client import Api

    api = Api(args.server, args.token)
    params: dict[str, Any] = {"limit": 500}
    if args.status:
        params["status"] = args.status
    items: list[dict[str, Any]] = []
    while True:
        page = api.get(f"/api/v1/studies/{args.study}/runs", params={**params, "offset": len(items)})
        items += page["items"]
        if not page["items"] or len(items) >= page["total"]:
            break
    if args.json:
        print(json.dumps(items, indent=2))
        return EXIT_OK
    rows = [[str(r["id"]), r["status"], f"{r['attempt']}/{r['max_attempts']}", str(r["seed"]), r["determinism"],
             printable(r["stack"]), _first_line(r.get("error"))] for r in items]
    print(table(["RUN", "STATUS", "ATTEMPT", "SEED", "LEVEL", "STACK", "ERROR"], rows) if rows else "no runs")
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    """A run's error and the tail of its output (stdout and stderr) as the worker captured it."""
    from app.cli_client import Api

    run = Api(args.server, args.token).get(f"/api/v1/runs/{args.run}")
    print(f"run {run['id']} (study {run['study_id']}, seed {run['seed']}, {run['determinism']}): {run['status']}"
          f", attempt {run['attempt']}/{run['max_attempts']}")
    if run.get("error"):
        print(f"error ({run.get('failure_kind') or 'error'}): {printable(run['error'])}")
    tail = run.get("stderr_tail")
    if tail:
        print("--- output tail ---")
        print(printable(tail[-args.tail:]) if args.tail else printable(tail))
    elif run["status"] == "failed":
        print("(the worker captured no output)")
    return EXIT_OK


def _verdict_summary(report: dict[str, Any], sid: int) -> int:
    """One line on stderr naming the failing verdicts; the exit code that goes with them."""
    failing = failing_verdicts(report)
    if failing:
        names = ", ".join(sorted({f"{v.get('level', 'cost')} {v['verdict']}" for v in failing}))
        print(f"steady: study {sid}: {len(failing)} failing verdict(s) ({printable(names)}): `steady report {sid}`",
              file=sys.stderr)
    else:
        print(f"steady: study {sid}: no failing verdict (`steady report {sid}`)", file=sys.stderr)
    return verdict_exit_code(report)


def _study_to_check(api, target: str) -> int:  # noqa: ANN001
    """A study id (digits that name no file) is used as it is; anything else is a spec to submit."""
    if target.isdigit() and not Path(target).exists():
        return int(target)
    spec = load_spec(target)
    study = api.post("/api/v1/studies", json=spec)
    print(f"submitted study {study['id']} ({printable(study['name'])}): {study['progress']['total']} runs",
          file=sys.stderr, flush=True)
    return study["id"]


def cmd_check(args: argparse.Namespace) -> int:
    """Steady as a CI gate: judge a study (submitting a spec first and waiting), exit 0/1/2."""
    from app.cli_client import Api
    from app.reports import gate

    api = Api(args.server, args.token)
    sid = _study_to_check(api, args.target)
    study = api.get(f"/api/v1/studies/{sid}")
    if study["status"] not in {"completed", "failed", "cancelled", "open"}:
        try:
            study = wait_for(api, sid)
        except KeyboardInterrupt:
            print(f"\nsteady: stopped waiting; study {sid} keeps running (`steady check {sid}` later)",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
    link = f"{api.server}/studies/{sid}"
    title = f"study {sid} ({study['name']})"
    if study["status"] in {"failed", "cancelled"}:
        items = [gate.GateItem("study", f"study {sid}", gate.FAIL,
                               f"the study {study['status']}: see `steady status {sid}`", "")]
    else:
        report = api.get(f"/api/v1/studies/{sid}/report")
        comparison = None
        if args.against:
            from urllib.parse import quote

            comparison = api.get(f"/api/v1/suites/{quote(args.against, safe='')}/baseline/compare",
                                 params={"study_id": sid})
            title += f" against the baseline of {args.against}"
        items = gate.gate_items(report, comparison)
    code = gate.exit_code(items)
    rows = [[i.status.upper() if i.status == gate.FAIL else i.status, i.kind, printable(i.name), printable(i.reason)]
            for i in items]
    print(table(["STATUS", "CHECK", "NAME", "WHY"], rows))
    print(f"steady check: {printable(title)}: {gate.outcome(code)} (exit {code}); {link}")
    if args.junit:
        from datetime import UTC, datetime

        Path(args.junit).parent.mkdir(parents=True, exist_ok=True)
        Path(args.junit).write_bytes(gate.junit_xml(items, suite_name=f"steady {title}", link=link,
                                                    timestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")))
    text = gate.markdown(items, title=title, link=link) if args.markdown or args.webhook else ""
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(text)
    if args.webhook:
        _post_summary(args.webhook, {"text": text, "exit_code": code, "outcome": gate.outcome(code),
                                     "study_id": sid, "link": link,
                                     "checks": [i.__dict__ for i in items]})
    return code


def _post_summary(url: str, body: dict[str, Any]) -> None:
    """POST the summary as JSON (Slack/Mattermost read ``text``). A delivery problem is a warning:
    the exit code stays the gate's verdict."""
    import httpx

    try:
        r = httpx.post(url, json=body, timeout=15.0)
        if r.status_code >= 400:
            print(f"steady: warning: the webhook answered {r.status_code}", file=sys.stderr)
    except httpx.HTTPError as exc:
        print(f"steady: warning: could not post the summary to the webhook: {exc}", file=sys.stderr)


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
        return EXIT_OK
    from app.engines.cli import launch_lines

    if args.study is not None:
        launches = api.get(f"/api/v1/studies/{args.study}/launches")["items"]
    else:
        launches = api.get("/api/v1/launches", params={"limit": 200})["items"]
    rows = [[str(s["id"]).rjust(4), s["status"], _bar(s["progress"], 20), printable(s["name"])] for s in studies]
    print(table(["  ID", "STATUS", "PROGRESS", "NAME"], rows))
    for s in studies:
        if args.study is not None and s.get("status_reason"):
            print(f"study {s['id']}: {printable(s['status_reason'])}")
        if args.study is not None and s.get("code_sha256"):
            commit = f", git {s['code_git_commit'][:10]}" if s.get("code_git_commit") else ""
            print(f"study {s['id']}: code {s['code_sha256'][:12]}{commit}{' (dirty)' if s.get('code_dirty') else ''}")
        if s.get("stage"):
            st = s["stage"]
            print(f"study {s['id']}: adaptive seeds, stage {st['stage']} of at most {st['last_stage']} "
                  f"({st['seeds']} of at most {st['max_seeds']} seeds)")
        lines = launch_lines([x for x in launches if x["study_id"] == s["id"]])
        if lines:
            print(f"study {s['id']}:")
            print("\n".join(lines))
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    from app.cli_client import Api

    api = Api(args.server, args.token)
    study = api.post(f"/api/v1/studies/{args.study}/cancel")
    p = study["progress"]
    print(f"cancelled study {study['id']} ({printable(study['name'])}): {p.get('cancelled', 0)} runs cancelled,"
          f" {p.get('running', 0)} running runs asked to stop, {p.get('completed', 0)} completed kept")
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    """Stack portability of two studies' final metric (the server's ``GET /api/v1/compare``)."""
    from app.cli_client import Api

    api = Api(args.server, args.token)
    params = {"baseline": args.baseline, "candidate": args.candidate, "metric": args.metric}
    if args.margin is not None:
        params["margin"] = args.margin
    if args.relative_margin is not None:
        params["relative_margin"] = args.relative_margin
    result = api.get("/api/v1/compare", params=params)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(_render_comparison(result))
    return EXIT_FAIL if result["verdict"] == "not_equivalent" else EXIT_OK


def _render_comparison(c: dict[str, Any]) -> str:
    def side(s: dict[str, Any]) -> str:
        return f"study {s['id']} ({printable(s['name'])}, {s['n_runs']} runs)"

    margin = "none given" if c.get("margin") is None else f"{c['margin']:.4g}"
    lines = [f"baseline  {side(c['baseline'])}", f"candidate {side(c['candidate'])}",
             f"final {printable(c['metric'])}, equivalence margin {margin}: {c['verdict']}"]
    code = c.get("code") or {}
    if code.get("differs"):
        lines.append(printable(code["note"]))
    lines.append("")
    rows = [[str(v.get("group", {}).get("determinism", "")), v["verdict"], str(v.get("n_runs", 0)),
             printable(v.get("reason", ""))] for v in c.get("verdicts", [])]
    if rows:
        lines.append(table(["DETERMINISM", "VERDICT", "RUNS", "WHY"], rows))
    else:
        lines.append("(no determinism level with completed runs in both studies)")
    return "\n".join(lines)


def cmd_login(args: argparse.Namespace) -> int:
    """Check a server and token together, then save them for this user."""
    from app.cli_client import Api, ApiError
    from app.cli_support import save_login

    token = args.token or os.environ.get("STEADY_TOKEN")
    if not token:
        if sys.stdin.isatty():
            import getpass

            token = getpass.getpass(f"token for {args.url}: ")
        else:
            token = sys.stdin.readline()
    token = token.strip()
    if not token:
        raise CliError("no token given: pass --token, or type it (or pipe it) when asked", EXIT_USAGE)
    api = Api(args.url, token)
    try:
        api.get("/api/v1/studies", params={"limit": 1})
    except ApiError as exc:
        if exc.status == 401:
            raise CliError(f"{api.server} refused this token (401): check it, or create one with "
                           "`steady token create --role user` on the server") from None
        raise
    path = save_login(api.server, token)
    print(f"logged in to {api.server}; saved to {path}")
    return EXIT_OK


def cmd_logout(args: argparse.Namespace) -> int:
    from app.cli_support import remove_login

    path = remove_login()
    print(f"forgot the login in {path}" if path else "not logged in")
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
    return verdict_exit_code(report)


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
    parser = argparse.ArgumentParser(
        prog="steady", description="Is my training stable?",
        epilog="--server, --token, --data-dir and --database-url go before or after the command. "
               "Exit codes: 0 ok, 1 failed (or a verdict failed), 2 usage, 130 Ctrl-C, 141 closed pipe.")
    parser.add_argument("--version", action="version", version=f"steady {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # Global options: accepted before the command (the top-level default) and after it (SUPPRESS,
    # so a subcommand that was not given the option keeps the value given before it).
    def server_opts(p: argparse.ArgumentParser, default: Any = argparse.SUPPRESS) -> None:
        p.add_argument("--data-dir", default=default,
                       help="where the embedded database lives (STEADY_DATA_DIR, default .steady)")
        p.add_argument("--database-url", default=default,
                       help="SQLAlchemy URL, e.g. postgresql+psycopg://… (STEADY_DATABASE_URL)")

    def client_opts(p: argparse.ArgumentParser, default: Any = argparse.SUPPRESS) -> None:
        p.add_argument("--server", default=default,
                       help="server URL (STEADY_SERVER, then `steady login`, default http://127.0.0.1:8000)")
        p.add_argument("--token", default=default,
                       help="API token (STEADY_TOKEN, then `steady login`, then <data-dir>/token)")

    server_opts(parser, None)
    client_opts(parser, None)

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

    p = sub.add_parser("login", help="check a server URL and token, and save both for this user")
    p.add_argument("url", help="the server, e.g. http://steady.example:8000")
    p.add_argument("--token", default=argparse.SUPPRESS,
                   help="API token (default: STEADY_TOKEN, else asked for, or read from stdin when piped)")
    p.set_defaults(func=cmd_login)

    p = sub.add_parser("logout", help="forget the saved server and token")
    p.set_defaults(func=cmd_logout)

    p = sub.add_parser("submit", help="submit a study spec (YAML or JSON)")
    client_opts(p)
    p.add_argument("spec", help="path to the spec, or - for stdin")
    p.add_argument("--wait", action="store_true",
                   help="show progress until the study ends; exit 1 if it failed or a verdict failed")
    p.add_argument("--code", metavar="DIR", help="ship this folder as the study's code (default: the git work tree "
                   "holding the spec, else the spec's folder)")
    p.add_argument("--max-code-mb", type=float, default=50.0, help="refuse to ship more code than this (default 50)")
    p.add_argument("--no-code", action="store_true",
                   help="ship nothing: the entrypoint is resolved on each worker's own filesystem")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "check", help="CI gate: judge a study (or submit a spec and wait); exit 0 pass, 1 fail, 2 inconclusive",
        description="Judge a study as a CI gate. Given a spec file, submit it and wait for it (like "
                    "`submit --wait`); given a study id, use that study (waiting if it still runs). Every level's "
                    "expectation, every verdict, every cost budget and, with --against, every comparison with the "
                    "suite's baseline snapshot is one check.",
        epilog="Exit codes: 0 every check passed; 1 a check failed (or the study failed, or the server refused); "
               "2 no check failed but one is inconclusive (too few runs, no margin or limit given). A failure "
               "wins over an inconclusive check. argparse usage errors also exit 2.")
    client_opts(p)
    p.add_argument("target", metavar="SPEC_OR_STUDY", help="a study spec (YAML/JSON, - for stdin) or a study id")
    p.add_argument("--against", metavar="SUITE",
                   help="also compare the study's final metrics with SUITE's baseline snapshot (TOST within each "
                        "metric's margin)")
    p.add_argument("--junit", metavar="PATH", help="write a JUnit XML report (one testcase per check)")
    p.add_argument("--markdown", metavar="PATH", help="write a Markdown summary (one line per check)")
    p.add_argument("--webhook", metavar="URL", help='POST the summary as JSON {"text": markdown, ...}')
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("runs", help="a study's runs: status, attempt, seed, level, error")
    client_opts(p)
    p.add_argument("study", type=int)
    p.add_argument("--status", choices=["queued", "running", "completed", "failed", "cancelled"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("logs", help="a run's error and the tail of its output")
    client_opts(p)
    p.add_argument("run", type=int)
    p.add_argument("--tail", type=int, default=0, help="only the last N characters")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("status", help="studies and their progress")
    client_opts(p)
    p.add_argument("study", nargs="?", type=int)
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("cancel", help="cancel a study: queued runs are dropped, running ones asked to stop")
    client_opts(p)
    p.add_argument("study", type=int)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("report", help="the stability report of a study")
    client_opts(p)
    p.add_argument("study", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("compare", help="are two studies' final metrics equivalent? (exit 1 when not)")
    client_opts(p)
    p.add_argument("baseline", type=int, help="study id of the baseline")
    p.add_argument("candidate", type=int, help="study id of the candidate")
    p.add_argument("--metric", default="loss")
    margin = p.add_mutually_exclusive_group()
    margin.add_argument("--margin", type=float, help="absolute equivalence margin")
    margin.add_argument("--relative-margin", type=float, help="margin as a share of the baseline mean, e.g. 0.01")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compare)

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
    client_opts(ls)
    ack = asub.add_parser("ack")
    client_opts(ack)
    ack.add_argument("id", type=int)
    p.set_defaults(func=cmd_alerts)

    from app.engines.cli import add_parser as add_launch_parser

    add_launch_parser(sub, client_opts)

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
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return code
    except CliError as exc:
        print(f"steady: {printable(exc.message)}", file=sys.stderr)
        return exc.code
    except ApiError as exc:
        detail = printable(exc.detail)
        plain = exc.status in (0, 401)  # unreachable, or the token: the message already says what to do
        print(f"steady: {detail}" if plain else f"steady: the server answered {exc.status}: {detail}",
              file=sys.stderr)
        return EXIT_FAIL
    except BrokenPipeError:
        # The reader went away (`steady status --json | head`): stop quietly, like `cat` would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("\nsteady: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
