"""``steady workers`` (list, quarantine, release, history) and ``steady schedules`` (add, list, delete)."""

from __future__ import annotations

import argparse
from typing import Any

from steady.server.cli.support import EXIT_OK, CliError, client_opts, code_opts, load_spec, table
from steady.server.kit.terminal import printable


def _api(args: argparse.Namespace) -> Any:
    from steady.server.cli.client import Api

    return Api(args.server, args.token)


def _all(api: Any, path: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    while True:
        page = api.get(path, params={"limit": 200, "offset": len(items)})
        items += page["items"]
        if not page["items"] or len(items) >= page["total"]:
            return items


def _worker_id(api: Any, name: str) -> int:
    """A worker's id from its name (or its id); refuses a name that several registrations share."""
    workers = _all(api, "/api/v1/workers")
    found = [w for w in workers if w["name"] == name] or [w for w in workers if str(w["id"]) == name]
    if not found:
        raise CliError(f"no worker named {name!r} (steady workers list shows them)")
    if len(found) > 1:
        ids = ", ".join(str(w["id"]) for w in found)
        raise CliError(f"{len(found)} workers are named {name!r} (ids {ids}): give the id")
    return int(found[0]["id"])


def _state(w: dict[str, Any]) -> str:
    q = w.get("quarantine")
    if q:
        return f"quarantined since {q['since'][:16].replace('T', ' ')} UTC by {q['by']}: {q['reason']}"
    return "running" if w["running_runs"] else "idle"


def cmd_list(args: argparse.Namespace) -> int:
    rows = [[str(w["id"]), w["name"], w["last_seen_at"][:19].replace("T", " "), _state(w)]
            for w in _all(_api(args), "/api/v1/workers")]
    print(printable(table(["id", "name", "last seen (UTC)", "state"], rows)))
    return EXIT_OK


def cmd_quarantine(args: argparse.Namespace) -> int:
    api = _api(args)
    wid = _worker_id(api, args.worker)
    w = api.post(f"/api/v1/workers/{wid}/quarantine", json={"reason": args.reason})
    print(printable(f"worker {w['name']} (id {w['id']}): {_state(w)}; it leases no run of a study that respects "
                    "quarantine until `steady workers release` lifts it"))
    return EXIT_OK


def cmd_release(args: argparse.Namespace) -> int:
    api = _api(args)
    wid = _worker_id(api, args.worker)
    body = {"reason": args.reason} if args.reason else {}
    w = api.post(f"/api/v1/workers/{wid}/release", json=body)
    print(printable(f"worker {w['name']} (id {w['id']}) released from quarantine; it leases runs again"))
    return EXIT_OK


def _event_line(e: dict[str, Any]) -> list[str]:
    at = e["at"][:16].replace("T", " ")
    if e["kind"] == "check":
        where = "" if e["first_divergent_step"] is None else f", first divergent step {e['first_divergent_step']}"
        return [at, "check", f"study {e['study_id']}: {e['verdict']}{where}"]
    why = f": {e['reason']}" if e["reason"] else ""
    return [at, e["kind"], f"by {e['actor']}{why}"]


def cmd_history(args: argparse.Namespace) -> int:
    api = _api(args)
    wid = _worker_id(api, args.worker)
    events = api.get(f"/api/v1/workers/{wid}/history", params={"limit": args.limit})["items"]
    if not events:
        print(f"worker {wid}: no quarantine and no fleet check recorded")
        return EXIT_OK
    print(printable(table(["at (UTC)", "event", "what"], [_event_line(e) for e in events])))
    return EXIT_OK


def _when(s: dict[str, Any]) -> str:
    if s["daily_at"]:
        return f"daily at {s['daily_at']} UTC"
    seconds = s["every_seconds"]
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"every {seconds // size}{unit}"
    return f"every {seconds}s"


def cmd_schedule_add(args: argparse.Namespace) -> int:
    from steady.server.cli.code import ship_options

    api = _api(args)
    spec = load_spec(args.spec)
    ship_options(args, api, spec, args.spec)
    s = api.post("/api/v1/schedules", json={"name": args.name or spec.get("name"), "spec": spec,
                                            "every": args.every, "daily": args.daily})
    print(printable(f"schedule {s['id']} ({s['name']}): {_when(s)}, next at "
                    f"{s['next_due_at'][:16].replace('T', ' ')} UTC"))
    return EXIT_OK


def cmd_schedule_list(args: argparse.Namespace) -> int:
    rows = []
    for s in _all(_api(args), "/api/v1/schedules"):
        last = "never" if s["last_fired_at"] is None else (
            f"study {s['last_study_id']}" if s["last_study_id"] is not None else s["last_error"] or "no study")
        rows.append([str(s["id"]), s["name"], _when(s), s["next_due_at"][:16].replace("T", " "), last])
    print(printable(table(["id", "name", "when", "next (UTC)", "last fire"], rows)))
    return EXIT_OK


def cmd_schedule_delete(args: argparse.Namespace) -> int:
    _api(args).request("DELETE", f"/api/v1/schedules/{args.schedule}")
    print(f"schedule {args.schedule} deleted; the studies it submitted stay")
    return EXIT_OK


def register(sub: Any) -> None:
    """Add ``workers`` and ``schedules`` to ``steady``'s subcommands (``sub``)."""
    p = sub.add_parser("workers", help="registered workers, their quarantine and history")
    client_opts(p)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    v = verbs.add_parser("list", help="every worker: last seen, running, idle or quarantined")
    client_opts(v)
    v.set_defaults(func=cmd_list)
    v = verbs.add_parser("quarantine", help="quarantine a worker (admin): it leases no run of a study that "
                                            "respects quarantine until released")
    client_opts(v)
    v.add_argument("worker", help="the worker's name (or id)")
    v.add_argument("--reason", required=True, help="why; kept in its history and sent with the alert")
    v.set_defaults(func=cmd_quarantine)
    v = verbs.add_parser("release", help="lift a worker's quarantine (admin)")
    client_opts(v)
    v.add_argument("worker", help="the worker's name (or id)")
    v.add_argument("--reason", help="kept in its history")
    v.set_defaults(func=cmd_release)
    v = verbs.add_parser("history", help="a worker's quarantines, releases and fleet-check results, newest first")
    client_opts(v)
    v.add_argument("worker", help="the worker's name (or id)")
    v.add_argument("--limit", type=int, default=50)
    v.set_defaults(func=cmd_history)

    p = sub.add_parser("schedules", help="study specs submitted on a schedule (a nightly fleet check)")
    client_opts(p)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    v = verbs.add_parser("add", help="submit a spec every interval or daily at a UTC time")
    client_opts(v)
    v.add_argument("spec", help="path to the spec (YAML or JSON)")
    when = v.add_mutually_exclusive_group(required=True)
    when.add_argument("--every", help="an interval: a whole number and s, m, h or d (e.g. 6h)")
    when.add_argument("--daily", metavar="HH:MM", help="a time of day, UTC")
    v.add_argument("--name", help="the schedule's name (default: the spec's)")
    code_opts(v)
    v.set_defaults(func=cmd_schedule_add)
    v = verbs.add_parser("list", help="every schedule: when, next time, last fire")
    client_opts(v)
    v.set_defaults(func=cmd_schedule_list)
    v = verbs.add_parser("delete", help="delete a schedule (its studies stay)")
    client_opts(v)
    v.add_argument("schedule", type=int)
    v.set_defaults(func=cmd_schedule_delete)
