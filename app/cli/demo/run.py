"""``steady demo``: a whole stability study on one machine, end to end.

Starts the server on the embedded SQLite default and a local worker, submits the bundled
demo studies (PyTorch and TensorFlow workloads, all three determinism levels), shows
progress, prints each study's report, and leaves the dashboard running at a printed URL.

The data folder is kept: a second demo opens the database the first left (every study a user
submitted to the demo server stays) and adds its own studies. SIGTERM stops the demo as Ctrl-C
does: the server's and the worker's process groups are stopped before it exits.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from steady.server.web.devserver import ServerProcess, ServerStartError, free_port, port_free, serve_argv, stop_group

DEMO_DIR = Path(__file__).resolve().parent
SPECS = ("torch_mlp.yaml", "torch_kernels.yaml", "keras_mlp.yaml")


QUICK_STEPS = 10  # the kernel study's steps at --quick: its seeded repeats part in every step on 2 threads


def _quick(spec: dict) -> dict:
    """A smaller matrix for tests: one seed, two repeats, one epoch, a workload counted in steps cut to
    ``QUICK_STEPS`` (what each level promises shows in the repeats; a seed band over real runs is
    tests/reports/test_report_e2e.py's). One seed cannot judge a seed band, so the quick spec asks for none:
    its metrics keep no ``max_std``."""
    spec = dict(spec)
    spec["seeds"] = spec["seeds"][:1]
    spec["metrics"] = [m if isinstance(m, str) else {k: v for k, v in m.items() if k != "max_std"}
                       for m in spec.get("metrics", [])]
    spec["repeats"] = min(spec.get("repeats", 1), 2)
    params = {**spec["workload"].get("params", {})}
    if "steps" in params:
        params["steps"] = min(params["steps"], QUICK_STEPS)
    else:
        params["epochs"] = 1
    spec["workload"] = {**spec["workload"], "params": params}
    return spec


def sources_spec(runs: int, *, quick: bool = False, first_seed: int = 0, max_runs: int | None = None,
                 numpy: bool = False, minutes: float | None = None) -> dict:
    """The sources demo: the built-in sources model (``torch_sources``, or its NumPy twin with ``numpy``), one arm
    per source of variance, ``runs`` runs per arm in the first stage (seeds from ``first_seed``, rounded up to a
    multiple of the grid's columns, so a repeated demo draws fresh seeds) and an init × data arm on a ⌊√runs⌋-column
    grid. With ``max_runs`` above ``runs`` the study carries a budget: the undecided sources' arms and the
    all-sources arm grow by ``runs`` per stage until each source's TOST decides or ``max_runs`` is reached
    (docs/sources.md); ``minutes``: the budget's time limit (no next stage that would end past it). ``quick``: a
    tiny one, for tests."""
    crossed = max(2, int(runs ** 0.5))
    first_seed = -(-first_seed // crossed) * crossed
    workload = ({"framework": "python", "name": "numpy_sources"} if numpy else
                {"framework": "torch", "name": "torch_sources"})
    spec = {
        "name": "sources: where does the variance come from?",
        "description": "Summers & Dinneen (ICML 2021), Table 2, on a CPU model: every source alone against all sources",
        "workload": {**workload, "params": {"epochs": 2 if quick else 30}},
        "seeds": list(range(first_seed, first_seed + runs)), "determinism": ["seeded"], "threads": 1, "max_attempts": 1,
        "sources": {"crossed": crossed},
        "metrics": [{"name": "val_loss"}, {"name": "val_acc"}],
    }
    if max_runs is not None and max_runs > runs:
        spec["budget"] = {"max_seeds": max_runs, "stage_seeds": runs, **({"max_minutes": minutes} if minutes else {})}
    return spec


def open_data_dir(data_dir: Path) -> tuple[str, str, int]:
    """The demo's database in ``data_dir``: a new one, or the one an earlier demo left, migrated and
    kept with every study in it. Returns this demo's user and worker tokens (the user token also in
    ``data_dir/token``, mode 0600) and how many studies were there already."""
    from sqlalchemy import func, select

    from steady.server.kit import migrate
    from steady.server.kit.auth import Role, create_token
    from steady.server.kit.config import Settings
    from steady.server.kit.db import Database
    from steady.server.models import Study

    data_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings(data_dir=data_dir, database_url="")
    db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
    try:
        migrate.upgrade(db.engine)
        with db.write() as session:
            kept = session.scalar(select(func.count()).select_from(Study)) or 0
            user_token = create_token(session, name="demo-user", role=Role.admin)[1]
            worker_token = create_token(session, name="demo-worker", role=Role.worker)[1]
    finally:
        db.dispose()
    token = data_dir / "token"
    token.unlink(missing_ok=True)  # written anew, never readable by others, even for a moment
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(user_token + "\n")
    return user_token, worker_token, kept


class _Terminated(Exception):
    """SIGTERM reached the demo: stop like Ctrl-C."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated


def run_demo(args: argparse.Namespace) -> int:
    from steady.server.cli.client import Api, wait_for
    from steady.server.reports.models import Report
    from steady.server.cli.demo.purposes import PURPOSES, purpose_line, summary_lines
    from steady.server.cli.render import render_report, sources_lines

    data_dir = Path(args.data_dir).resolve()
    user_token, worker_token, kept = open_data_dir(data_dir)

    port = args.port if port_free(args.port) else free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "STEADY_DATA_DIR": str(data_dir), "STEADY_PUBLIC_URL": url}
    env.pop("STEADY_DATABASE_URL", None)
    server_log, worker_log = data_dir / "server.log", data_dir / "worker.log"
    print(f"steady demo: data in {data_dir}"
          + (f" (kept from an earlier demo: {kept} stud{'y' if kept == 1 else 'ies'}; this demo adds its own)" if kept else ""))
    print(f"steady demo: starting the server at {url} (SQLite, WAL) …", flush=True)
    server = ServerProcess(serve_argv(port), url=url, log_path=server_log, env=env, start_timeout=90,
                           stop_timeout=20)
    worker = None
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        try:
            server.start()
        except ServerStartError as exc:
            raise SystemExit(f"steady demo: {exc}") from None
        print("steady demo: starting a local worker (runs each training run in a fresh subprocess) …", flush=True)
        sources = bool(getattr(args, "sources", False))
        concurrency = ["--concurrency", str(max(1, min(2, os.cpu_count() or 1)))] if sources else []
        worker = subprocess.Popen(
            [sys.executable, "-m", "steady.server.cli", "worker", "--server", url, "--work-dir", str(data_dir / "work"),
             *concurrency],
            env={**env, "STEADY_TOKEN": worker_token}, stdout=open(worker_log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,  # noqa: SIM115
        )
        api = Api(url, user_token, timeout=120)
        study_ids = []
        demos = [None] if sources else [PURPOSES[name] for name in SPECS]
        specs = ([sources_spec(args.runs, quick=args.quick, first_seed=args.first_seed,
                               max_runs=getattr(args, "max_runs", None), numpy=getattr(args, "numpy", False),
                               minutes=getattr(args, "minutes", None))]
                 if sources else
                 [yaml.safe_load((DEMO_DIR / name).read_text()) for name in SPECS])
        for spec in specs:
            if args.quick and not sources:
                spec = _quick(spec)
            study = api.post("/api/v1/studies", json=spec)
            study_ids.append(study["id"])
            print(f"  submitted study {study['id']}: {study['name']} ({study['progress']['total']} runs)")
        print()
        for sid in study_ids:
            wait_for(api, sid, interval=1.0, stream=sys.stdout)
            if worker.poll() is not None:
                raise SystemExit(f"steady demo: the worker exited:\n{worker_log.read_text()[-2000:]}")
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        judged = []
        for sid, demo in zip(study_ids, demos, strict=True):
            print()
            report = Report.model_validate(api.get(f"/api/v1/studies/{sid}/report"))
            if sources:
                print(f"Study {sid}: {report.study.name} ({report.n_runs_judged} runs)")
                print("\n".join(sources_lines(report, color=color)))
                print(f"(the whole report: steady report {sid})")
            else:
                print(render_report(report, color=color))
            if demo is not None:
                print(f"  {purpose_line(demo, report)}")
                judged.append((demo, report))
        print()
        if judged:  # the last screen: every study, its outcome and why, then where to look
            print("\n".join(summary_lines(judged, url=url, token_path=str(data_dir / "token"), quick=args.quick,
                                         color=color)))
        else:
            print(f"Dashboard: {url}/studies/{study_ids[0]}   (log in with the token in {data_dir / 'token'})")
            print(f"CLI:       steady login {url} < {data_dir / 'token'}   then: steady report {study_ids[0]}")
            print(f"API:       {url}/docs")
        if args.exit:
            return 0
        print("The server and worker keep running; press Ctrl-C to stop.", flush=True)
        server.wait()
        return 1
    except (KeyboardInterrupt, _Terminated):
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
        stop_group(worker, timeout=20)
        server.stop()
        signal.signal(signal.SIGTERM, previous)
