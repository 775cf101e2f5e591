"""``steady demo --controls --fleet``: planted faults prove that a fleet check names the faulty worker, and only it.

One server (SQLite, in a temporary folder) and four healthy local worker agents serve every check; a fifth agent
carries the planted fault (``STEADY_FAULT``, which the agent passes to the built-in canary's runs only) and is
restarted under another name for each kind of fault. Per kind, ``--checks`` (default 5) independent fleet checks
(the spec ``steady fleet check --repeats 2 --workers …`` submits) run the canary on the five workers and are read
from their reports: a check names the faulty worker when it is among its stack group's findings (a bit flip, a
wrong kernel, another reduction order) or, for the slow device, among the slow workers and not as a numerics
fault. A healthy worker named anywhere in a check is a false alarm. The first row is the control with no fault:
five healthy workers, none may be named.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from scipy import stats

from steady.server.cli.demo.controls import markdown_table

HEALTHY = 4
REPEATS = 2


@dataclass(frozen=True)
class FleetControl:
    name: str
    fault: str | None  # STEADY_FAULT of the fifth worker; None: it is healthy too
    named_as: str | None  # how the faulty worker must be named: "numerics" or "slow"; None: nobody named


CONTROLS: tuple[FleetControl, ...] = (
    FleetControl("no fault (five healthy workers)", None, None),
    FleetControl("bit flip, p = 0.1 per layer call", "bitflip:p=0.1", "numerics"),
    FleetControl("wrong kernel (first layer × (1 + 2⁻¹²))", "wrong_kernel", "numerics"),
    FleetControl("reduction order reversed", "reduction_order", "numerics"),
    FleetControl("slow device (0.05 s per layer call)", "slow:s=0.05", "slow"),
)


@dataclass(frozen=True)
class FleetRow:
    control: str
    fault: str | None
    named_as: str | None
    checks: int
    named: int  # checks that named the faulty worker as required
    kinds: tuple[str, ...]  # how it was named: consistent, intermittent, slow
    steps: tuple[int, ...]  # first divergent steps, over the checks
    healthy_named: int  # healthy workers named, over the checks
    healthy_judged: int  # healthy workers × checks
    outcomes: tuple[str, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return self.healthy_named == 0 and self.named == (self.checks if self.named_as else 0)


class FleetBench:
    """The shared server and workers."""

    def __init__(self, root: Path) -> None:
        from steady.server.cli.demo.run import open_data_dir
        from steady.server.web.devserver import ServerProcess, free_port, serve_argv

        self.root = root
        user_token, self.worker_token, _ = open_data_dir(root / "data")
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, "STEADY_DATA_DIR": str(root / "data"), "STEADY_PUBLIC_URL": self.url}
        self.env.pop("STEADY_DATABASE_URL", None)
        self.env.pop("STEADY_FAULT", None)
        self.server = ServerProcess(serve_argv(port), url=self.url, log_path=root / "server.log", env=self.env,
                                    start_timeout=120, stop_timeout=20)
        self.user_token = user_token
        self.agents: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        from steady.server.cli.client import Api

        self.server.start()
        self.api = Api(self.url, self.user_token, timeout=120)

    def start_agent(self, name: str, fault: str | None) -> None:
        env = {**self.env, "STEADY_TOKEN": self.worker_token, **({"STEADY_FAULT": fault} if fault else {})}
        with open(self.root / f"{name}.log", "ab") as out:
            self.agents[name] = subprocess.Popen(
                [sys.executable, "-m", "steady.worker", "--server", self.url, "--name", name, "--device", "cpu",
                 "--poll-max", "0.5", "--grace", "5", "--work-dir", str(self.root / name)],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def stop_agent(self, name: str) -> None:
        from steady.server.web.devserver import stop_group

        stop_group(self.agents.pop(name), timeout=30)

    def wait_registered(self, names: Sequence[str], timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_agents()
            seen = {w["name"] for w in self.api.get("/api/v1/workers", params={"limit": 500})["items"]}
            if set(names) <= seen:
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"steady demo: workers {', '.join(sorted(set(names) - seen))} did not register "
                                 f"within {timeout:.0f} s (logs in {self.root})")
            time.sleep(0.5)

    def _check_agents(self) -> None:
        for name, proc in self.agents.items():
            if proc.poll() is not None:
                tail = (self.root / f"{name}.log").read_text(errors="replace")[-2000:]
                raise SystemExit(f"steady demo: worker {name} exited ({proc.returncode}):\n{tail}")

    def checks(self, workers: Sequence[str], n: int):
        """``n`` fleet checks of ``workers``, submitted together; their reports once every one has ended."""
        from steady.server.cli.fleet import fleet_spec
        from steady.server.reports.models import Report

        ids = []
        for i in range(n):
            spec = fleet_spec(workload="canary", labels=[], workers=list(workers), repeats=REPEATS, wait_s=900,
                              plan_one_in=None)
            spec["name"] = f"fleet check {i + 1} of {n} (planted-fault controls)"
            ids.append(self.api.post("/api/v1/studies", json=spec)["id"])
        pending = set(ids)
        while pending:
            self._check_agents()
            pending = {sid for sid in pending
                       if self.api.get(f"/api/v1/studies/{sid}")["status"] not in {"completed", "failed", "cancelled"}}
            if pending:
                time.sleep(1.0)
        return [Report.model_validate(self.api.get(f"/api/v1/studies/{sid}/report")) for sid in ids]

    def close(self) -> None:
        from steady.server.web.devserver import stop_group

        for name in list(self.agents):
            stop_group(self.agents.pop(name), timeout=30)
        self.server.stop()


def judge(control: FleetControl, reports, faulty: str, healthy: Sequence[str], seconds: float) -> FleetRow:
    named = healthy_named = 0
    kinds: set[str] = set()
    steps: set[int] = set()
    outcomes: list[str] = []
    for report in reports:
        fleet = report.fleet
        outcomes.append(report.outcome.status)
        findings = {f.worker: f for g in (fleet.groups if fleet else []) for f in g.findings}
        slow = {s.worker for s in (fleet.slow if fleet else [])}
        healthy_named += sum(w in findings or w in slow for w in healthy)
        if control.named_as is None:
            healthy_named += faulty in findings or faulty in slow  # the fifth worker is healthy too
            continue
        if control.named_as == "numerics" and faulty in findings:
            named += 1
            kinds.add(findings[faulty].kind)
            if findings[faulty].first_step is not None:
                steps.add(findings[faulty].first_step)
        elif control.named_as == "slow" and faulty in slow and faulty not in findings:
            named += 1
            kinds.add("slow")
    judged = len(reports) * (len(healthy) + (control.named_as is None))
    return FleetRow(control.name, control.fault, control.named_as, len(reports), named, tuple(sorted(kinds)),
                    tuple(sorted(steps)), healthy_named, judged, tuple(sorted(set(outcomes))), seconds)


def run_controls(controls: Sequence[FleetControl] = CONTROLS, *, checks: int = 5,
                 progress: Callable[[FleetRow], None] | None = None) -> list[FleetRow]:
    root = Path(tempfile.mkdtemp(prefix="steady-fleet-controls-"))
    bench = FleetBench(root)
    rows: list[FleetRow] = []
    try:
        bench.start()
        healthy = [f"healthy-{i + 1}" for i in range(HEALTHY)]
        for name in healthy:
            bench.start_agent(name, None)
        for control in controls:
            t0 = time.monotonic()
            slug = (control.fault or "none").split(":")[0].replace("_", "-")
            faulty = f"planted-{slug}"
            bench.start_agent(faulty, control.fault)
            bench.wait_registered([*healthy, faulty])
            reports = bench.checks([*healthy, faulty], checks)
            bench.stop_agent(faulty)
            row = judge(control, reports, faulty, healthy, time.monotonic() - t0)
            rows.append(row)
            if progress is not None:
                progress(row)
    finally:
        bench.close()
    shutil.rmtree(root, ignore_errors=True)
    return rows


def upper_bound(alarms: int, judged: int, confidence: float = 0.95) -> float:
    """The one-sided Clopper–Pearson upper bound of a rate seen ``alarms`` times in ``judged`` trials."""
    return 1.0 if alarms >= judged else float(stats.beta.ppf(confidence, alarms + 1, judged - alarms))


HEADER = ("planted", "STEADY_FAULT", "faulty worker named", "named as", "first divergent step",
          "healthy workers named", "checks' outcomes")


def _steps(row: FleetRow) -> str:
    if row.named_as == "slow":
        return "— (right numbers)"
    if not row.steps:
        return "—"
    return str(row.steps[0]) if len(row.steps) == 1 else f"{row.steps[0]}–{row.steps[-1]}"


def format_table(rows: Sequence[FleetRow]) -> str:
    return markdown_table(HEADER, [
        (r.control, "none" if r.fault is None else f"`{r.fault}`",
         "nobody to name" if r.named_as is None else f"{r.named} of {r.checks}",
         ", ".join(r.kinds) or "—", _steps(r), f"{r.healthy_named} of {r.healthy_judged}", ", ".join(r.outcomes))
        for r in rows])


def main(args) -> int:
    checks = int(getattr(args, "checks", None) or 5)
    controls = [c for c in CONTROLS if not getattr(args, "only", None) or any(o in c.name for o in args.only)]
    print(f"steady demo --controls --fleet: {len(controls)} controls × {checks} fleet checks, each of {HEALTHY} "
          f"healthy local workers and one planted one, the canary {REPEATS} times on each (one server) …", flush=True)

    def progress(row: FleetRow) -> None:
        named = "nobody to name" if row.named_as is None else f"faulty worker named in {row.named} of {row.checks}"
        print(f"  {'ok   ' if row.ok else 'WRONG'} {row.control}: {named}; healthy workers named "
              f"{row.healthy_named} of {row.healthy_judged} ({row.seconds:.0f} s)", flush=True)

    rows = run_controls(controls, checks=checks, progress=progress)
    print()
    print(format_table(rows))
    alarms, judged = sum(r.healthy_named for r in rows), sum(r.healthy_judged for r in rows)
    print(f"\n{sum(r.ok for r in rows)} of {len(rows)} controls as required. False alarms: {alarms} healthy workers "
          f"named in {judged} judged (rate at most {upper_bound(alarms, judged):.3f}, one-sided 95% Clopper–Pearson "
          "bound).")
    return 0 if all(r.ok for r in rows) else 1
