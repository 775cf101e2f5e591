"""The one CLI, ``steady``: serve, worker, launch, login, submit, check, status, cancel, report, compare, demo,
token, migrate, calibrate.

Imports are lazy per command: ``steady worker`` on a GPU box imports neither FastAPI nor
SQLAlchemy, and ``steady submit`` needs only the HTTP client.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from steady.server import __version__
from steady.server.cli.results import (
    cmd_alerts,
    cmd_check,
    cmd_compare,
    cmd_login,
    cmd_logout,
    cmd_report,
)
from steady.server.cli.server import cmd_calibrate, cmd_demo, cmd_migrate, cmd_serve, cmd_token
from steady.server.cli.client import wait_for
from steady.server.cli.studies import (
    cmd_cancel,
    cmd_logs,
    cmd_runs,
    cmd_status,
    cmd_submit,
)
from steady.server.cli.support import (
    EXIT_BROKEN_PIPE,
    EXIT_CANNOT_JUDGE,
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
)
from steady.server.kit.terminal import printable
from steady.worker.contract.protocol import RunStatus

__all__ = ["build_parser", "main", "wait_for"]


def cmd_worker(argv: list[str]) -> int:
    from steady.worker.agent.cli import main as worker_main

    return worker_main(argv)


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors exit with the command's ``error_exit`` default when it sets one
    (``steady check``: 3, "could not judge"), else 2. Subparsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(self.get_default("error_exit") or EXIT_USAGE, f"{self.prog}: error: {message}\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        # unknown options after a command are reported by the top-level parser: with the command's code
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.set_defaults(error_exit=getattr(parsed, "error_exit", None))
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="steady", description="Is my training stable?",
        epilog="--server, --token, --data-dir and --database-url go before or after the command. "
               "Exit codes: 0 ok, 1 failed (or a verdict failed), 2 usage, 130 Ctrl-C, 141 closed pipe; "
               "`check`: 0 pass, 1 fail, 2 inconclusive, 3 could not judge.")
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

    def code_opts(p: argparse.ArgumentParser) -> None:
        """How ``submit`` and ``check SPEC`` ship the code (``steady.server.cli.code``)."""
        p.add_argument("--code", metavar="DIR", help="ship this folder as the study's code (default: the git work "
                       "tree holding the spec, else the spec's folder); an arm's `code: DIR` ships its own folder")
        p.add_argument("--max-code-mb", type=float, default=50.0,
                       help="refuse to ship more code than this, per archive (default 50)")
        p.add_argument("--no-code", action="store_true",
                       help="ship nothing: the entrypoint is resolved on each worker's own filesystem")

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
    code_opts(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "check", help="CI gate: judge a study (or submit a spec and wait); exit 0 pass, 1 fail, 2 inconclusive, "
                      "3 could not judge",
        description="Judge a study as a CI gate. Given a spec file, submit it and wait for it (like "
                    "`submit --wait`); given a study id, use that study (waiting if it still runs). Every level's "
                    "expectation, every verdict, every cost budget and, with --against, every comparison with the "
                    "suite's baseline snapshot is one check.",
        epilog="Exit codes: 0 every check passed; 1 a check failed (or every run of the study failed); "
               "2 no check failed but one is inconclusive (too few runs, no margin or limit given); 3 could not "
               "judge: wrong arguments, a spec missing or invalid, the server unreachable or refusing (401, 403, "
               "404, 422), the study cancelled. A failure wins over an inconclusive check.")
    client_opts(p)
    p.add_argument("target", metavar="SPEC_OR_STUDY", help="a study spec (YAML/JSON, - for stdin) or a study id")
    p.add_argument("--against", metavar="SUITE",
                   help="also compare the study's final metrics with SUITE's baseline snapshot (TOST within each "
                        "metric's margin)")
    p.add_argument("--junit", metavar="PATH", help="write a JUnit XML report (one testcase per check)")
    p.add_argument("--markdown", metavar="PATH", help="write a Markdown summary (one line per check)")
    p.add_argument("--webhook", metavar="URL", help='POST the summary as JSON {"text": markdown, ...}')
    code_opts(p)
    p.set_defaults(func=cmd_check, error_exit=EXIT_CANNOT_JUDGE)
    p = sub.add_parser("runs", help="a study's runs: status, attempt, seed, level, error")
    client_opts(p)
    p.add_argument("study", type=int)
    p.add_argument("--status", choices=[s.value for s in RunStatus])
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

    from steady.server.cli.launch import add_parser as add_launch_parser

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
    from steady.server.cli.client import ApiError

    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return code
    except CliError as exc:
        print(f"steady: {printable(exc.message)}", file=sys.stderr)
        return getattr(args, "error_exit", None) or exc.code
    except ApiError as exc:
        detail = printable(exc.detail)
        plain = exc.status in (0, 401)  # unreachable, or the token: the message already says what to do
        print(f"steady: {detail}" if plain else f"steady: the server answered {exc.status}: {detail}",
              file=sys.stderr)
        return getattr(args, "error_exit", None) or EXIT_FAIL
    except BrokenPipeError:
        # The reader went away (`steady status --json | head`): stop quietly, like `cat` would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("\nsteady: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED

