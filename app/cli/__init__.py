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
from steady.server.cli import bisect, fleet, launch, localize, results, server, studies, workers
from steady.server.cli.client import wait_for
from steady.server.cli.support import (
    EXIT_BROKEN_PIPE,
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    client_opts,
    server_opts,
)
from steady.server.kit.terminal import printable

__all__ = ["build_parser", "main", "wait_for"]


def cmd_worker(argv: list[str]) -> int:
    from steady.worker.agent.cli import main as worker_main

    return worker_main(argv)


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors exit with the command's ``error_exit`` default when it sets one
    (the gates ``report``, ``submit``, ``check``: 3, "could not judge"), else 2. Subparsers are of this class too."""

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
    """The ``steady`` parser: each command module adds its own subcommands and their options
    (``register(sub)`` in :mod:`.server`, :mod:`.studies`, :mod:`.results`, :mod:`.launch`)."""
    parser = _Parser(
        prog="steady", description="Is my training stable?",
        epilog="--server, --token, --data-dir and --database-url go before or after the command. "
               "Exit codes: 0 ok, 1 failed (or a verdict failed), 2 usage, 130 Ctrl-C, 141 closed pipe; "
               "the gates (`report`, `submit`, `check`): 0 pass, 1 fail, 2 inconclusive, 3 could not judge.")
    parser.add_argument("--version", action="version", version=f"steady {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    server_opts(parser, None)
    client_opts(parser, None)
    for command_module in (server, studies, results, localize, bisect, launch, workers, fleet):
        command_module.register(sub)
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

