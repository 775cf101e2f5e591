"""``steady`` commands that drive studies over the API: submit (and wait), runs, logs, status, cancel."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import TYPE_CHECKING, Any

from steady.server.cli.client import progress_bar, wait_for
from steady.server.cli.support import (
    EXIT_CANNOT_JUDGE,
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    client_opts,
    code_opts,
    failing_verdicts,
    get_report,
    load_spec,
    table,
    verdict_exit_code,
)
from steady.server.kit.terminal import printable, printable_output
from steady.server.runs.conflicts import conflict_lines
from steady.worker.contract.protocol import RunStatus

if TYPE_CHECKING:
    from steady.server.reports.models import Report


def cmd_submit(args: argparse.Namespace) -> int:
    from steady.server.cli.client import Api

    from steady.server.cli.code import ship_options

    spec = load_spec(args.spec)
    api = Api(args.server, args.token)
    ship_options(args, api, spec, args.spec)
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
        # as `steady check`: a cancelled study leaves nothing to judge (3), a failed one is a failure (1)
        return EXIT_CANNOT_JUDGE if final["status"] == "cancelled" else EXIT_FAIL
    return _verdict_summary(get_report(api, sid), sid)


def _first_line(text: str | None) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return printable(lines[0][:200]) if lines else ""


def cmd_runs(args: argparse.Namespace) -> int:
    """A study's runs: id, status, attempt, seed, level, the first line of the error."""
    from steady.server.cli.client import Api

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
    """A run's story: what it ran (argv as run, params, config file, code), its error, and the tail of
    its output (stdout and stderr) as the worker captured it, for a completed run too."""
    from steady.server.cli.client import Api

    run = Api(args.server, args.token).get(f"/api/v1/runs/{args.run}")
    print(f"run {run['id']} (study {run['study_id']}, seed {run['seed']}, {run['determinism']}): {run['status']}"
          f", attempt {run['attempt']}/{run['max_attempts']}")
    for line in _story_lines(run):
        print(line)
    if run.get("error"):
        print(f"error ({run.get('failure_kind') or 'error'}): {printable(run['error'])}")
    for line in conflict_lines(run.get("metric_conflicts")):
        print(printable(line))
    tail = run.get("stderr_tail")
    if tail:
        print("--- output tail ---")
        print(printable_output(tail[-args.tail:]) if args.tail else printable_output(tail))
    elif run["status"] in ("failed", "completed"):
        print("(the worker captured no output)")
    return EXIT_OK


def _story_lines(run: dict[str, Any]) -> list[str]:
    """``key: value`` lines of what the run executed (``RunOut.argv`` and ``RunOut.story``)."""
    story = run.get("story") or {}
    lines = []
    if run.get("argv"):
        lines.append("argv as run: " + printable(shlex.join(run["argv"])))
    elif story.get("command"):
        lines.append("command: " + printable(shlex.join(story["command"])) + " (not run yet)")
    elif story.get("entrypoint"):
        lines.append("entrypoint: " + printable(story["entrypoint"]))
    elif story.get("workload"):
        lines.append("workload: " + printable(story["workload"]))
    if story.get("params"):
        lines.append("params: " + printable(json.dumps(story["params"], sort_keys=True)))
    if story.get("config_file"):
        cfg = story["config_file"]
        lines.append(f"config file: {printable(cfg.get('name'))} ({len(cfg.get('content') or '')} characters)")
    if story.get("code_sha256"):
        commit = f", git {story['code_git_commit']}" if story.get("code_git_commit") else ""
        lines.append(f"code: {story['code_sha256']}{printable(commit)}{' (dirty)' if story.get('code_dirty') else ''}")
    return lines


def _verdict_summary(report: Report, sid: int) -> int:
    """One line on stderr with the study's outcome and its reason (the report's, as every gate says it);
    the exit code that goes with them."""
    out = report.outcome
    failing = failing_verdicts(report)
    what = f"FAILED ({len(failing)} failing check(s))" if out.status == "fail" else (
        "passed" if out.status == "pass" else "inconclusive")
    print(f"steady: study {sid}: {what}: {printable(out.reason)} (`steady report {sid}`)", file=sys.stderr)
    return verdict_exit_code(report)


def cmd_status(args: argparse.Namespace) -> int:
    from steady.server.cli.client import Api

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
    from steady.server.cli.launch import launch_lines

    if args.study is not None:
        launches = api.get(f"/api/v1/studies/{args.study}/launches")["items"]
    else:
        launches = api.get("/api/v1/launches", params={"limit": 200})["items"]
    rows = [[str(s["id"]).rjust(4), s["status"], progress_bar(s["progress"], 20), printable(s["name"])] for s in studies]
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
    from steady.server.cli.client import Api

    api = Api(args.server, args.token)
    study = api.post(f"/api/v1/studies/{args.study}/cancel")
    p = study["progress"]
    print(f"cancelled study {study['id']} ({printable(study['name'])}): {p.get('cancelled', 0)} runs cancelled,"
          f" {p.get('running', 0)} running runs asked to stop, {p.get('completed', 0)} completed kept")
    return EXIT_OK


def register(sub: Any) -> None:
    """Add submit, runs, logs, status, cancel to ``steady``'s subcommands (``sub``)."""
    p = sub.add_parser("submit", help="submit a study spec (YAML or JSON)")
    client_opts(p)
    p.add_argument("spec", help="path to the spec, or - for stdin")
    p.add_argument("--wait", action="store_true",
                   help="show progress until the study ends; exit 0 pass, 1 fail (the study or a verdict), "
                        "2 inconclusive (errors: 3)")
    code_opts(p)
    p.set_defaults(func=cmd_submit, error_exit=EXIT_CANNOT_JUDGE)

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
