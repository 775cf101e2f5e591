"""Shared fixtures: real databases (SQLite files and throwaway PostgreSQL databases) and servers.

PostgreSQL: ``STEADY_TEST_POSTGRES_URL`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``)
names a maintenance database; every test gets its own database, cloned from a template
migrated once per session, and dropped afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from steady.server.web.devserver import ServerProcess, free_port, serve_argv

REPO = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("STEADY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def wait_until(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError naming ``what``
    after ``timeout`` seconds. The one way a test waits for a state another process or thread reaches."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _pg_admin():
    return create_engine(PG_URL, isolation_level="AUTOCOMMIT")


def pg_url_for(dbname: str) -> str:
    return make_url(PG_URL).set(database=dbname).render_as_string(hide_password=False)


def create_pg_database(template: str | None = None) -> str:
    name = f"steady_test_{uuid.uuid4().hex[:12]}"
    engine = _pg_admin()
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
    engine.dispose()
    return name


def drop_pg_database(name: str) -> None:
    engine = _pg_admin()
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def _migrate(url: str) -> None:
    from steady.server.kit import migrate
    from steady.server.kit.db import Database

    db = Database(url)
    migrate.upgrade(db.engine)
    db.dispose()


@pytest.fixture
def clock():
    """The server's clock (``steady.server.models.base.clock``) for apps in this process: a test that needs a
    lease or a session to expire advances it instead of sleeping."""
    from steady.server.models.base import clock as server_clock

    yield server_clock
    server_clock.reset()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tpl") / "template.db"
    _migrate(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    name = create_pg_database()
    _migrate(pg_url_for(name))
    yield name
    drop_pg_database(name)


# for a test of what only PostgreSQL does (a connection ended under a transaction): db_url on it alone
POSTGRES_ONLY = pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)


def terminate_own_connection(session) -> None:
    """PostgreSQL ends this session's backend, as an outage or a restart does mid-transaction: the
    statement raises OperationalError and the connection is gone."""
    session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> Iterator[str]:
    """A fresh, migrated database on each backend."""
    if request.param == "sqlite":
        path = tmp_path / "steady.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
    else:
        name = create_pg_database(template=request.getfixturevalue("pg_template"))
        yield pg_url_for(name)
        drop_pg_database(name)


@dataclass
class ApiClient:
    """A TestClient bound to one app, with a token per role."""

    client: object
    app: object
    tokens: dict[str, str] = field(default_factory=dict)

    def h(self, role: str = "user") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    def get(self, path: str, role: str = "user", **kw):
        return self.client.get(path, headers=self.h(role), **kw)

    def post(self, path: str, role: str = "user", **kw):
        return self.client.post(path, headers=self.h(role), **kw)

    def delete(self, path: str, role: str = "user", **kw):
        return self.client.delete(path, headers=self.h(role), **kw)


def make_settings(db_url: str, tmp_path: Path, **overrides):
    from steady.server.kit.config import Settings

    return Settings(database_url=db_url, data_dir=tmp_path / "data", **overrides)


def add_tokens(app) -> dict[str, str]:
    from steady.server.kit.auth import Role, create_token

    tokens = {}
    with app.state.database.write() as session:
        for role in Role:
            tokens[role.value] = create_token(session, name=f"test-{role.value}", role=role)[1]
    return tokens


@pytest.fixture
def make_api(db_url, tmp_path):
    """Factory: an app on the test database with optional settings overrides."""
    from fastapi.testclient import TestClient

    from steady.server.web.main import create_app

    clients = []

    def _make(**overrides) -> ApiClient:
        app = create_app(make_settings(db_url, tmp_path, **overrides))
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        return ApiClient(client=client, app=app, tokens=add_tokens(app))

    yield _make
    for c in clients:
        c.__exit__(None, None, None)


@pytest.fixture
def api(make_api) -> ApiClient:
    return make_api()


# --- live servers in subprocesses ------------------------------------------------------------


@dataclass
class LiveServer:
    url: str
    data_dir: Path
    env: dict[str, str]
    tokens: dict[str, str]
    proc: ServerProcess | None = None
    log_path: Path | None = None
    workers: int = 1  # uvicorn worker processes

    def headers(self, role: str = "user") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    def start(self, *, healthy: bool = True) -> None:
        """Spawn the server and wait until /healthz answers 200 (any answer with ``healthy=False``)."""
        if self.proc is None:
            port = int(self.url.rsplit(":", 1)[1])
            self.proc = ServerProcess(serve_argv(port, workers=self.workers), url=self.url, log_path=self.log_path,
                                      env=self.env, cwd=REPO)
        self.proc.start(healthy=healthy)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            self.proc.stop(sig)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def client(self, role: str = "user") -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(role), timeout=30)


def server_env(data_dir: Path, database_url: str = "", **settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEADY_")}
    env["STEADY_DATA_DIR"] = str(data_dir)
    if database_url:
        env["STEADY_DATABASE_URL"] = database_url
    for key, value in settings.items():
        env[f"STEADY_{key.upper()}"] = str(value)
    return env


def create_token_cli(env: dict[str, str], role: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "steady.server.cli", "token", "create", "--role", role, "--quiet"],
        env=env, cwd=REPO, capture_output=True, text=True, check=True,
    )
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture
def live_server_factory(tmp_path):
    """Start real ``steady serve`` processes: factory(database_url='', **settings) -> LiveServer."""
    servers: list[LiveServer] = []

    def _start(database_url: str = "", **settings) -> LiveServer:
        data_dir = tmp_path / f"server{len(servers)}"
        data_dir.mkdir()
        env = server_env(data_dir, database_url, **settings)
        tokens = {role: create_token_cli(env, role) for role in ("admin", "user", "worker")}
        server = LiveServer(
            url=f"http://127.0.0.1:{free_port()}", data_dir=data_dir, env=env, tokens=tokens,
            log_path=data_dir / "server.log",
        )
        server.start()
        servers.append(server)
        return server

    yield _start
    for s in servers:
        s.stop()


@pytest.fixture
def live_server(live_server_factory) -> LiveServer:
    return live_server_factory(lease_seconds=5, heartbeat_seconds=1, reaper_interval_seconds=1)


def database_with_one_run(db_url: str, *, status: str) -> tuple:
    """A ``Database`` at ``db_url`` (the ``db_url`` fixture's, migrated) given one external study with one attempt-1 run in
    ``status``: (database, run id). The caller disposes of the database."""
    from steady.server.kit.db import Database
    from steady.server.models import Run, Study, utcnow

    db = Database(db_url)
    with db.write() as s:
        study = Study(name="s", kind="external", status="open", spec={})
        s.add(study)
        s.flush()
        run = Run(study_id=study.id, seed=0, repeat=0, determinism="seeded", stack="x", framework="torch",
                  required_labels=[], status=status, attempt=1, max_attempts=1, fingerprint={}, digests={},
                  determinism_applied={}, timings={}, final_metrics={}, created_at=utcnow())
        s.add(run)
        s.flush()
        rid = run.id
    return db, rid
