"""What the CLI needs besides its commands: exit codes, one-line errors, the login file, spec loading.

Kept free of server dependencies (no FastAPI, no SQLAlchemy) so every user command stays light.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from steady.server.reports.models import Report

# Exit codes, for every command (docs/cli.md, "Exit codes").
EXIT_OK = 0  # done; for the gates (report / submit / check) and compare: no verdict failed
EXIT_FAIL = 1  # the command failed (server refused or unreachable, study failed) or a verdict failed
EXIT_USAGE = 2  # wrong arguments, or a spec file that is missing or not valid YAML (not the gates: 3)
# The gates (`report`, `submit`, `check`): no check failed but one is inconclusive.
EXIT_INCONCLUSIVE = 2
# The gates: could not judge (wrong arguments, a missing or invalid spec, the server unreachable or
# refusing, the study cancelled). Not 1 or 2, so a CI job that lets an inconclusive study (2) pass
# never lets a typo pass, and a job can tell "the code failed" from "the gate broke".
EXIT_CANNOT_JUDGE = 3
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_BROKEN_PIPE = 141  # the reader of stdout went away, e.g. `steady status --json | head` (128 + SIGPIPE)

# Verdicts that mean "not stable": out of tolerance, unstable, not equivalent, over the cost budget.
LOGIN_HINT = "run `steady login URL`, or pass --token / set STEADY_TOKEN"


class CliError(Exception):
    """A failure the user can fix: printed as one line ``steady: <message>``, then exit ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAIL) -> None:
        super().__init__(message)
        self.message, self.code = message, code


# --- the login file: one entry per server, and the default server ---------------------------


def config_path() -> Path:
    """``$XDG_CONFIG_HOME/steady/config.json`` (default ``~/.config/steady/config.json``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "steady" / "config.json"


def _url(server: Any) -> str:
    return str(server).rstrip("/")


def read_logins() -> tuple[str | None, dict[str, str]]:
    """(the default server, {server: token}) from the login file: ``{"default": URL, "servers": {URL: {"token":
    …}}}``. The one-server file of earlier versions (``{"server", "token"}``) reads as one entry, the default.
    Nobody logged in, or a file that cannot be read: ``(None, {})``."""
    try:
        data = json.loads(config_path().read_text())
    except (OSError, ValueError):
        return None, {}
    if not isinstance(data, dict):
        return None, {}
    servers: dict[str, str] = {}
    if isinstance(data.get("servers"), dict):
        servers = {_url(url): str(entry["token"]) for url, entry in data["servers"].items()
                   if isinstance(entry, dict) and entry.get("token")}
    elif data.get("server") and data.get("token"):
        servers = {_url(data["server"]): str(data["token"])}
    default = data.get("default", data.get("server"))
    return (_url(default) if default and _url(default) in servers else None), servers


def load_login() -> dict[str, str]:
    """The default server's ``{"server", "token"}``, or ``{}`` when nobody logged in."""
    default, servers = read_logins()
    return {"server": default, "token": servers[default]} if default else {}


def _write_logins(default: str | None, servers: dict[str, str]) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"default": default, "servers": {url: {"token": token} for url, token in servers.items()}}, f)
        f.write("\n")
    path.chmod(0o600)  # an older file may have had wider permissions
    return path


def save_login(server: str, token: str) -> tuple[Path, list[str]]:
    """Save (or replace) ``server``'s token and make it the default server. Returns the file and the other
    servers still saved."""
    _, servers = read_logins()
    servers.pop(_url(server), None)
    servers[_url(server)] = token  # the last saved comes last
    return _write_logins(_url(server), servers), [url for url in servers if url != _url(server)]


def remove_login(server: str | None = None) -> tuple[Path | None, str | None, str | None, list[str]]:
    """Forget ``server``'s login (default: the default server's). Returns (the file, the server forgotten or
    None, the default server now, the servers still saved); the file goes when the last login does."""
    path = config_path()
    default, servers = read_logins()
    target = _url(server) if server else default
    if target is None or target not in servers:
        return None, None, default, list(servers)
    del servers[target]
    if default == target or default not in servers:
        default = next(reversed(servers), None)  # the most recently saved of the rest
    if servers:
        _write_logins(default, servers)
    else:
        path.unlink(missing_ok=True)
    return path, target, default, list(servers)


# --- study specs ----------------------------------------------------------------------------


def load_spec(path: str) -> dict[str, Any]:
    """A study spec from a YAML/JSON file (``-``: stdin); every problem is one line with file:line:column."""
    import yaml

    if path == "-":
        text, name = sys.stdin.read(), "<stdin>"
    else:
        name = path
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise CliError(f"no such file: {path}", EXIT_USAGE) from None
        except IsADirectoryError:
            raise CliError(f"{path} is a directory, not a study spec", EXIT_USAGE) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}", EXIT_USAGE) from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
        problem = exc.problem or exc.context or "not valid YAML"
        raise CliError(f"{where}: {problem}", EXIT_USAGE) from None
    except yaml.YAMLError as exc:
        raise CliError(f"{name}: {' '.join(str(exc).split())}", EXIT_USAGE) from None
    if not isinstance(data, dict):
        raise CliError(f"{name}: a study spec is a mapping (YAML or JSON object)", EXIT_USAGE)
    return data


# --- verdicts -------------------------------------------------------------------------------


def get_report(api: Any, study_id: int) -> Report:
    """A study's report from the server, read as the typed ``Report``."""
    from steady.server.reports.models import Report

    return Report.model_validate(api.get(f"/api/v1/studies/{study_id}/report"))


def failing_verdicts(report: Report) -> list[tuple[str, str]]:
    """(check, its plain first line) of the report's failing checks, as the server's one failure
    policy judged them (``Report.outcome``, ``steady.server.reports.outcome``)."""
    return [(c.name, c.summary) for c in report.outcome.checks if c.status == "fail"]


def verdict_exit_code(report: Report) -> int:
    """The study's outcome as every gate exits by it (``report``, ``submit --wait``, ``check``): 0 pass,
    1 fail, 2 inconclusive; their errors exit 3 (``error_exit``), so 2 never means a typo."""
    return {"fail": EXIT_FAIL, "inconclusive": EXIT_INCONCLUSIVE}.get(report.outcome.status, EXIT_OK)


def table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns, two spaces apart; the last column is not padded."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for r in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(r, widths, strict=False)] + [str(r[-1])]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


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
