"""Fixtures for the scale and fault tests: several real ``steady serve`` processes on one database."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import (REPO, LiveServer, cancel_unfinished_studies, create_pg_database, drop_pg_database, pg_url_for,
                            server_env, start_live_server)

FAST_LEASES = {"lease_seconds": 3, "heartbeat_seconds": 1, "reaper_interval_seconds": 0.5}


@dataclass
class Server(LiveServer):
    """A LiveServer that may run ``--workers N`` uvicorn processes."""

    def restart(self) -> None:
        self.start()


@pytest.fixture
def pg_database(pg_template) -> Iterator[str]:
    """A fresh migrated PostgreSQL database; yields its SQLAlchemy URL."""
    name = create_pg_database(template=pg_template)
    yield pg_url_for(name)
    drop_pg_database(name)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend_url(request, tmp_path) -> str:
    """A database URL on each backend (the SQLite file is created by the first server)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared' / 'steady.db'}"
    return request.getfixturevalue("pg_database")


class SharedServers:
    """One API per backend on a database of its own, started at its first use and shared by a module's tests (an
    API costs interpreters' starts): what a test leaves queued or running is cancelled before the next one gets
    it, so each test judges only its own studies and runs. ``settings``: the servers' (``workers=2``, leases)."""

    def __init__(self, tmp_path_factory, sqlite_template, prefix: str, **settings) -> None:
        self.tmp_path_factory, self.sqlite_template, self.prefix, self.settings = \
            tmp_path_factory, sqlite_template, prefix, settings
        self.started: dict[str, tuple[Server, str]] = {}
        self.pg_names: list[str] = []

    def get(self, backend_url: str, request=None) -> tuple[Server, str]:
        """(server, database URL) of the backend ``backend_url`` is on (the ``backend_url`` fixture's; PostgreSQL needs
        the test's ``request`` for its template)."""
        backend = "sqlite" if backend_url.startswith("sqlite") else "postgres"
        if backend in self.started:
            cancel_unfinished_studies(self.started[backend][0])
            return self.started[backend]
        root = self.tmp_path_factory.mktemp(f"{self.prefix}-{backend}")
        if backend == "sqlite":
            url = f"sqlite:///{root / 'shared' / 'steady.db'}"
        else:
            self.pg_names.append(create_pg_database(template=request.getfixturevalue("pg_template")))
            url = pg_url_for(self.pg_names[-1])
        server = start_live_server(root / "api", url, sqlite_template=self.sqlite_template, cls=Server,
                                   **self.settings)
        self.started[backend] = (server, url)
        return self.started[backend]

    def close(self) -> None:
        for server, _ in self.started.values():
            server.stop()
        for name in self.pg_names:
            drop_pg_database(name)


@pytest.fixture
def cluster(tmp_path, sqlite_template):
    """Factory: cluster(database_url, n=1, workers=1, **settings) -> list[Server] sharing one database
    (tokens made in process, once, on that database)."""
    started: list[Server] = []

    def _start(database_url: str, n: int = 1, workers: int = 1, **settings) -> list[Server]:
        servers = []
        tokens: dict[str, str] | None = None
        for _ in range(n):
            s = start_live_server(tmp_path / f"api{len(started)}", database_url, sqlite_template=sqlite_template,
                                  workers=workers, cls=Server, tokens=tokens, **settings)
            tokens = s.tokens
            started.append(s)
            servers.append(s)
        return servers

    yield _start
    for s in started:
        s.stop()


def study_body(runs: int, **overrides) -> dict:
    body = {
        "name": "scale", "workload": {"framework": "torch", "name": "torch_mlp"},
        "seeds": list(range(runs)), "repeats": 1, "determinism": ["seeded"], "metrics": [{"name": "loss"}],
    }
    body.update(overrides)
    return body


def create_study(server: LiveServer, runs: int, **overrides) -> int:
    with server.client("user") as c:
        r = c.post("/api/v1/studies", json=study_body(runs, **overrides))
        assert r.status_code == 201, r.text
        return r.json()["id"]


def all_runs(server: LiveServer, study_id: int) -> list[dict]:
    items: list[dict] = []
    with server.client("user") as c:
        while True:
            page = c.get(f"/api/v1/studies/{study_id}/runs", params={"limit": 500, "offset": len(items)}).json()
            items += page["items"]
            if len(items) >= page["total"]:
                return items


def series(server: LiveServer, run_id: int, key: str = "loss") -> dict:
    with server.client("user") as c:
        r = c.get(f"/api/v1/runs/{run_id}/metrics/{key}")
        assert r.status_code == 200, r.text
        return r.json()


def sql(url: str, statement: str, **params):
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            result = conn.execute(text(statement), params)
            return result.all() if result.returns_rows else None
    finally:
        engine.dispose()


def fake_worker_cmd(server: LiveServer, name: str, **opts) -> list[str]:
    cmd = [sys.executable, "-m", "tests.scale.fakeworker", "--server", server.url,
           "--token", server.tokens["worker"], "--name", name]
    for k, v in opts.items():
        cmd += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return cmd


def spawn(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            env={**server_env(log.parent), "PYTHONUNBUFFERED": "1"}, start_new_session=True)
