"""Shared pieces of the benchmarks: real ``steady serve`` processes, tokens, studies, client processes.

Benchmarks write JSON to bench/results/ (git-ignored); they are measurements, not tests.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import httpx

from steady.server.web.devserver import ServerProcess, free_port, serve_argv

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
PG_ADMIN_URL = os.environ.get("STEADY_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def machine() -> dict:
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


@contextmanager
def postgres_database():
    """A throwaway database on the PostgreSQL server; yields its URL and drops it afterwards."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"steady_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


class Server:
    """``steady serve`` in a subprocess on a free port, with one token per role."""

    def __init__(self, database_url: str, workdir: Path, workers: int = 2, **settings) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("STEADY_")}
        self.env.update({"STEADY_DATA_DIR": str(workdir), "STEADY_DATABASE_URL": database_url})
        self.env.update({f"STEADY_{k.upper()}": str(v) for k, v in settings.items()})
        self.workers = workers
        self.tokens = {role: self._token(role) for role in ("user", "worker")}
        self.proc = ServerProcess(serve_argv(self.port, workers=workers), url=self.url, env=self.env, cwd=REPO,
                                  log_path=workdir / "server.log")

    def _token(self, role: str) -> str:
        out = subprocess.run([sys.executable, "-m", "steady.server.cli", "token", "create", "--role", role, "--quiet"],
                             env=self.env, cwd=REPO, capture_output=True, text=True, check=True)
        return out.stdout.strip().splitlines()[-1]

    def __enter__(self) -> Server:
        self.proc.start()
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stop()

    def create_study(self, runs: int) -> int:
        body = {"name": "bench", "workload": {"framework": "torch", "name": "torch_mlp"},
                "seeds": list(range(runs)), "repeats": 1, "determinism": ["seeded"], "metrics": [{"name": "loss"}],
                "max_attempts": 1}
        r = httpx.post(self.url + "/api/v1/studies", json=body, headers={"Authorization": f"Bearer {self.tokens['user']}"},
                       timeout=60)
        r.raise_for_status()
        return r.json()["id"]


def run_clients(script: Path, n_procs: int, args: list[list[str]], timeout: float, python: str | None = None) -> list[dict]:
    """Start client processes (``script`` with per-process args), each printing one JSON line; collect them."""
    procs = [subprocess.Popen([python or sys.executable, str(script), "_client", *a], cwd=REPO, stdout=subprocess.PIPE,
                              text=True, env={**os.environ}) for a in args[:n_procs]]
    return _collect(procs, timeout)


def _collect(procs: list[subprocess.Popen], timeout: float) -> list[dict]:
    """The one JSON line each client process prints last; a client that fails fails the benchmark."""
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"client exited {p.returncode}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def write_result(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), "when": time.strftime("%Y-%m-%dT%H:%M:%S"), **data}, indent=2))
    return path


def run_synced_clients(cmd_per_proc: list[list[str]], timeout: float, lead_s: float = 0.5, on_start=None) -> list[dict]:
    """Start client processes that set up (import, register, lease), print ``ready``, then read the
    common start time (epoch seconds) from stdin; collect the one JSON line each prints at the end.

    Starting only once every client is ready keeps slow start-up (imports on a loaded machine)
    out of the measured window.
    """
    procs = [subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ}) for cmd in cmd_per_proc]
    try:
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"client did not get ready (exit {p.poll()}): {line[:500]!r}")
        if on_start is not None:
            on_start()  # e.g. read the server's CPU time once set-up requests are done
        start_at = time.time() + lead_s
        for p in procs:
            p.stdin.write(f"{start_at}\n")
            p.stdin.flush()
        return _collect(procs, timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
