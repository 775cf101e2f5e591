"""``steady demo``: a whole stability study on one machine, end to end.

Starts the server on the embedded SQLite default and a local worker, submits the bundled
demo studies (PyTorch and TensorFlow workloads, all three determinism levels), shows
progress, prints each study's report, and leaves the dashboard running at a printed URL.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from steady.server.web.devserver import ServerProcess, ServerStartError, free_port, port_free, serve_argv, stop_group

DEMO_DIR = Path(__file__).resolve().parent
SPECS = ("torch_mlp.yaml", "torch_kernels.yaml", "keras_mlp.yaml")


def _quick(spec: dict) -> dict:
    """A smaller matrix for tests: fewer seeds and repeats, one epoch."""
    spec = dict(spec)
    spec["seeds"] = spec["seeds"][:2]
    spec["repeats"] = min(spec.get("repeats", 1), 2)
    spec["workload"] = {**spec["workload"], "params": {**spec["workload"].get("params", {}), "epochs": 1}}
    return spec


def run_demo(args: argparse.Namespace) -> int:
    from steady.server.kit import migrate
    from steady.server.kit.auth import Role, create_token
    from steady.server.cli.client import wait_for
    from steady.server.cli.client import Api
    from steady.server.kit.config import Settings
    from steady.server.kit.db import Database
    from steady.server.reports.models import Report
    from steady.server.cli.render import render_report

    data_dir = Path(args.data_dir).resolve()
    if data_dir.exists():
        shutil.rmtree(data_dir)  # a demo starts from nothing each time
    data_dir.mkdir(parents=True)
    settings = Settings(data_dir=data_dir, database_url="")
    db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
    migrate.upgrade(db.engine)
    with db.write() as session:
        user_token = create_token(session, name="demo-user", role=Role.admin)[1]
        worker_token = create_token(session, name="demo-worker", role=Role.worker)[1]
    db.dispose()
    (data_dir / "token").write_text(user_token + "\n")
    (data_dir / "token").chmod(0o600)

    port = args.port if port_free(args.port) else free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "STEADY_DATA_DIR": str(data_dir), "STEADY_PUBLIC_URL": url}
    env.pop("STEADY_DATABASE_URL", None)
    server_log, worker_log = data_dir / "server.log", data_dir / "worker.log"
    print(f"steady demo: data in {data_dir}")
    print(f"steady demo: starting the server at {url} (SQLite, WAL) …", flush=True)
    server = ServerProcess(serve_argv(port), url=url, log_path=server_log, env=env, start_timeout=90,
                           stop_timeout=20)
    worker = None
    try:
        try:
            server.start()
        except ServerStartError as exc:
            raise SystemExit(f"steady demo: {exc}") from None
        print("steady demo: starting a local worker (runs each training run in a fresh subprocess) …", flush=True)
        worker = subprocess.Popen(
            [sys.executable, "-m", "steady.server.cli", "worker", "--server", url, "--work-dir", str(data_dir / "work")],
            env={**env, "STEADY_TOKEN": worker_token}, stdout=open(worker_log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,  # noqa: SIM115
        )
        api = Api(url, user_token, timeout=120)
        study_ids = []
        for name in SPECS:
            spec = yaml.safe_load((DEMO_DIR / name).read_text())
            if args.quick:
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
        for sid in study_ids:
            print()
            print(render_report(Report.model_validate(api.get(f"/api/v1/studies/{sid}/report")), color=color))
        print()
        print(f"Dashboard: {url}/studies/{study_ids[0]}   (log in with the token in {data_dir / 'token'})")
        print(f"API:       {url}/docs")
        print(f"CLI:       steady login {url} < {data_dir / 'token'}   then: steady status")
        if args.exit:
            return 0
        print("The server and worker keep running; press Ctrl-C to stop.", flush=True)
        server.wait()
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop_group(worker, timeout=20)
        server.stop()
