"""``steady`` commands that read verdicts over the API: check (the CI gate), compare, report, alerts;
and login / logout, which save or forget the server and token they use."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steady.server.cli.client import wait_for
from steady.server.cli.support import (
    EXIT_CANNOT_JUDGE,
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    client_opts,
    code_opts,
    get_report,
    load_spec,
    table,
    verdict_exit_code,
)
from steady.server.kit.terminal import printable

if TYPE_CHECKING:
    from steady.server.reports.models import Compare, CompareMetric, CompareStudy



def _study_to_check(api, target: str, args: argparse.Namespace) -> int:
    """A study id (digits that name no file) is used as it is; anything else is a spec to submit,
    with its code shipped as ``steady submit`` ships it."""
    if target.isascii() and target.isdigit() and not Path(target).exists():
        return int(target)
    from steady.server.cli.code import ship_options

    spec = load_spec(target)
    ship_options(args, api, spec, target, out=sys.stderr)
    study = api.post("/api/v1/studies", json=spec)
    print(f"submitted study {study['id']} ({printable(study['name'])}): {study['progress']['total']} runs",
          file=sys.stderr, flush=True)
    return study["id"]


def cmd_check(args: argparse.Namespace) -> int:
    """Steady as a CI gate: judge a study (submitting a spec first and waiting), exit 0/1/2/3.

    Every error (a spec, the server, a cancelled study) exits 3 (``error_exit``, set by the parser):
    the gate could not judge, and a job that lets "inconclusive" (2) pass must not pass it. A study
    whose runs all failed is evidence against the code under test: a failure (1)."""
    from steady.server.cli.client import Api
    from steady.server.cli import gate

    api = Api(args.server, args.token)
    sid = _study_to_check(api, args.target, args)
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
    if study["status"] == "cancelled":
        raise CliError(f"study {sid} was cancelled: nothing to judge (`steady status {sid}`)")
    report = get_report(api, sid)  # a failed study too: its report fails it, for the reason it ended on
    comparison = None
    if args.against and study["status"] != "failed":
        from urllib.parse import quote

        from steady.server.reports.models import BaselineComparisonOut

        comparison = BaselineComparisonOut.model_validate(api.get(
            f"/api/v1/suites/{quote(args.against, safe='')}/baseline/compare", params={"study_id": sid}))
        title += f" against the baseline of {args.against}"
    items = gate.gate_items(report, comparison)
    code = gate.exit_code(items)
    rows = [[i.status.upper() if i.status == gate.FAIL else i.status, i.kind, printable(i.name), printable(i.reason)]
            for i in items]
    print(table(["STATUS", "CHECK", "NAME", "WHY"], rows))
    print(f"steady check: {printable(title)}: {gate.outcome(code)} (exit {code}): "
          f"{printable(gate.outcome_reason(items, report))}; {link}")
    if args.junit:
        from datetime import UTC, datetime

        _write(args.junit, gate.junit_xml(items, suite_name=f"steady {title}", link=link,
                                          timestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")))
    text = gate.markdown(items, title=title, link=link) if args.markdown or args.webhook else ""
    if args.markdown:
        _write(args.markdown, text.encode())
    if args.webhook:
        _post_summary(args.webhook, {"text": text, "exit_code": code, "outcome": gate.outcome(code),
                                     "reason": gate.outcome_reason(items, report),
                                     "study_id": sid, "link": link,
                                     "checks": [i.__dict__ for i in items]})
    return code


def _write(path: str, data: bytes) -> None:
    """A report file the CI reads: one it cannot find must not read as the gate's verdict (exit 3)."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None


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


def cmd_compare(args: argparse.Namespace) -> int:
    """Stack portability of two studies' final metric (the server's ``GET /api/v1/compare``)."""
    from steady.server.cli.client import Api

    api = Api(args.server, args.token)
    params = {"baseline": args.baseline, "candidate": args.candidate}
    if args.metric is not None:
        params["metric"] = args.metric
    if args.margin is not None:
        params["margin"] = args.margin
    if args.relative_margin is not None:
        params["relative_margin"] = args.relative_margin
    from steady.server.reports.models import Compare

    result = Compare.model_validate(api.get("/api/v1/compare", params=params))
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        print(_render_comparison(result))
    return EXIT_FAIL if result.verdict == "not_equivalent" else EXIT_OK


def _render_comparison(c: Compare) -> str:
    """The two studies, what differs between them and what a difference is attributed to, then the verdicts."""
    def side(s: CompareStudy) -> str:
        return f"study {s.id} ({printable(s.name)}, {s.n_runs} runs)"

    def margin(m: CompareMetric) -> str:
        if m.margin is None:
            return "no margin given"
        origin = {"spec": "from the spec", "query": "given", "relative_margin": "relative"}.get(m.margin_from, "")
        return f"margin {m.margin:.4g} ({origin})"

    lines = [f"baseline  {side(c.baseline)}", f"candidate {side(c.candidate)}"]
    if c.differences:
        lines.append("differs by:")
        lines += [f"  {printable(d.note)}" for d in c.differences]
    else:
        lines.append("differs by: nothing recorded (same setup, same stack fingerprint)")
    lines.append(printable(c.attribution))
    lines.append("final " + "; ".join(f"{printable(m.name)}, {margin(m)}" for m in c.metrics) + f": {c.verdict}")
    lines.append("")
    several = len(c.metrics) > 1
    rows = [[*([printable(v.metric)] if several else []), v.group.determinism, v.verdict, str(v.n_runs),
             printable(v.reason)] for v in c.verdicts]
    if rows:
        lines.append(table([*(["METRIC"] if several else []), "DETERMINISM", "VERDICT", "RUNS", "WHY"], rows))
    else:
        lines.append("(no determinism level with completed runs in both studies)")
    return "\n".join(lines)


def cmd_login(args: argparse.Namespace) -> int:
    """Check a server and token together, then save them for this user."""
    from steady.server.cli.client import Api, ApiError
    from steady.server.cli.support import save_login

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
    path, others = save_login(api.server, token)
    print(f"logged in to {api.server} (the default server now); saved to {path}"
          + (f"; still saved: {', '.join(others)} (--server or STEADY_SERVER picks one)" if others else ""))
    return EXIT_OK


def cmd_logout(args: argparse.Namespace) -> int:
    from steady.server.cli.support import remove_login

    path, forgotten, default, left = remove_login(args.url)
    if forgotten is None:
        print(f"not logged in to {args.url.rstrip('/')} (saved: {', '.join(left)})" if args.url and left
              else "not logged in")
    elif default:
        print(f"forgot the login to {forgotten} in {path}; default server now: {default}"
              + (f" (also saved: {', '.join(s for s in left if s != default)})" if len(left) > 1 else ""))
    else:
        print(f"forgot the login to {forgotten}; no login left ({path} removed)")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from steady.server.cli.client import Api
    from steady.server.cli.render import render_report

    api = Api(args.server, args.token)
    report = get_report(api, args.study)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        print(render_report(report, color=color))
    if args.tensorboard or args.mlflow:
        from steady.server.cli.exports import write_mlflow, write_tensorboard
        from steady.server.reports.models import Bands

        bands = [Bands.model_validate(api.get(f"/api/v1/studies/{args.study}/bands",
                                              params={"metric": m.name, "max_points": 2000}))
                 for m in report.metrics]
        out = sys.stderr if args.json else sys.stdout
        if args.tensorboard:
            path = write_tensorboard(args.tensorboard, report, bands)
            print(f"TensorBoard: wrote {path} (tensorboard --logdir {args.tensorboard}: Custom Scalars)", file=out)
        if args.mlflow:
            run_id = write_mlflow(args.mlflow, report, bands, experiment=args.mlflow_experiment,
                                  token=os.environ.get("MLFLOW_TRACKING_TOKEN"))
            print(f"MLflow: logged summary run {run_id} in experiment {args.mlflow_experiment!r}", file=out)
    return verdict_exit_code(report)


def cmd_alerts(args: argparse.Namespace) -> int:
    from steady.server.cli.client import Api

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


def register(sub: Any) -> None:
    """Add login, logout, check, report, compare, alerts to ``steady``'s subcommands (``sub``)."""
    p = sub.add_parser("login", help="check a server URL and token, and save both for this user (one login per "
                                     "server; the last one is the default server)")
    p.add_argument("url", help="the server, e.g. http://steady.example:8000")
    p.add_argument("--token", default=argparse.SUPPRESS,
                   help="API token (default: STEADY_TOKEN, else asked for, or read from stdin when piped)")
    p.set_defaults(func=cmd_login)

    p = sub.add_parser("logout", help="forget one server's saved login (default: the default server's)")
    p.add_argument("url", nargs="?", help="the server to forget (default: the default server)")
    p.set_defaults(func=cmd_logout)

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

    p = sub.add_parser("report", help="the stability report of a study; exit 0 pass, 1 fail, 2 inconclusive, "
                       "3 could not judge")
    client_opts(p)
    p.add_argument("study", type=int)
    p.add_argument("--json", action="store_true")
    p.add_argument("--tensorboard", metavar="LOGDIR", help="also write the bands (with what they are and N), the "
                   "verdicts and a sources table as TensorBoard event files, with custom-scalars margin charts")
    p.add_argument("--mlflow", metavar="TRACKING_URI", help="also log a summary run (metrics and tags) into this "
                   "MLflow tracking server (token: MLFLOW_TRACKING_TOKEN)")
    p.add_argument("--mlflow-experiment", default="steady", help="the MLflow experiment of the summary run")
    p.set_defaults(func=cmd_report, error_exit=EXIT_CANNOT_JUDGE)

    p = sub.add_parser("compare", help="are two studies' final metrics equivalent? (exit 1 when not)")
    client_opts(p)
    p.add_argument("baseline", type=int, help="study id of the baseline")
    p.add_argument("candidate", type=int, help="study id of the candidate")
    p.add_argument("--metric", help="the metric to judge (default: every metric both studies' specs name)")
    margin = p.add_mutually_exclusive_group()
    margin.add_argument("--margin", type=float, help="absolute equivalence margin (default: the spec's margin)")
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
