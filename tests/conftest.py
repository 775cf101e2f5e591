"""Shared fixtures: real databases (SQLite files and throwaway PostgreSQL databases) and servers.

PostgreSQL: ``STEADY_TEST_POSTGRES_URL`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``)
names a maintenance database; every test gets its own database, cloned from a template
migrated once per session, and dropped afterwards.

Parallel runs (pytest-xdist, ``make test``): every fixture here is per worker process. Session fixtures
(the templates, the shared server) exist once per worker; database names carry the worker's id
(``PYTEST_XDIST_WORKER``, ``gw0``…; ``main`` without xdist); ports come from the OS; paths from tmp_path.

Servers: ``live_server`` is one ``steady serve`` process per worker session, shared by the tests that
use it; each test isolates itself by its own data (its own studies, named as it likes; ids parsed from
answers, never assumed), and what it leaves queued or running is cancelled when it ends, so no later
test's worker agent leases it. A test that kills, restarts or configures a server asks
``live_server_factory`` for a private one.
"""

from __future__ import annotations

import dataclasses
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
from tests.skip_policy import (  # noqa: F401 - pytest finds hooks by name here: skips fail a run where CI is set
    pytest_collectreport,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

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


def user_project(root: Path, files: dict[str, str], message: str = "my script") -> Path:
    """A user's project as they publish it: ``files`` (dedented) in a fresh git repository, committed."""
    import textwrap

    root.mkdir(parents=True)
    for name, text_ in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text_).lstrip())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", message], cwd=root, check=True)
    return root


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of ``pid`` from ``/proc/PID/stat``; None once it is gone. The
    command name may hold spaces and parentheses, so the fields are read after its last ``)``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (exited, not yet reaped) is dead for a test's purposes."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] != "Z"


def _pg_admin():
    return create_engine(PG_URL, isolation_level="AUTOCOMMIT")


def pg_url_for(dbname: str) -> str:
    return make_url(PG_URL).set(database=dbname).render_as_string(hide_password=False)


def xdist_worker() -> str:
    """This test process's name under pytest-xdist (``gw0``, ``gw1``…), ``main`` when run without it."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def create_pg_database(template: str | None = None) -> str:
    name = f"steady_test_{xdist_worker()}_{uuid.uuid4().hex[:12]}"
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
# The backends ``db_url`` runs a test on: both unless a ``backends`` mark (on the test, else its module) names
# fewer. SQLITE_ONLY, as a module's ``pytestmark`` or on a test: its SQL is the ORM's, the same on both, so a
# PostgreSQL pass would repeat the SQLite one. A test in such a module whose SQL or locking differs (leasing's
# SKIP LOCKED, FOR UPDATE, an upsert, raw SQL) takes BOTH_BACKENDS back. Both stay for the committer, migrations,
# concurrency and faults (tests/scale), and the end-to-end path keeps its PostgreSQL pass (tests/engines/test_slurm.py:
# a server on PostgreSQL, real worker agents, a study to completion).
SQLITE_ONLY = pytest.mark.backends("sqlite")
BOTH_BACKENDS = pytest.mark.backends("sqlite", "postgres")
BACKEND_PARAMS = {"sqlite": "sqlite", "postgres": pytest.param("postgres", marks=pytest.mark.postgres)}


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "backends(*names): the database backends db_url runs the test on "
                                       "(tests/conftest.py: SQLITE_ONLY, BOTH_BACKENDS)")


def pytest_collection_modifyitems(config, items) -> None:
    """The slow tier first (a stable sort: otherwise in file order). Parallel workers take tests in this
    order, so the long training runs start at once and the short tests fill the gaps around them,
    instead of one long test starting near the end and running alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def _parametrizes(metafunc, name: str) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        if name in ([n.strip() for n in names.split(",")] if isinstance(names, str) else names):
            return True
    return False


def _own_db_url(metafunc) -> bool:
    """The test gets db_url from here (a module may define its own: tests/api/test_calibration_api.py)."""
    defs = metafunc._arg2fixturedefs.get("db_url")
    return bool(defs) and Path(defs[-1].func.__code__.co_filename).resolve() == Path(__file__).resolve()


def pytest_generate_tests(metafunc) -> None:
    if ("db_url" in metafunc.fixturenames and _own_db_url(metafunc)
            and not _parametrizes(metafunc, "db_url")):  # POSTGRES_ONLY sets its own
        mark = metafunc.definition.get_closest_marker("backends")
        names = mark.args if mark else ("sqlite", "postgres")
        metafunc.parametrize("db_url", [BACKEND_PARAMS[n] for n in names], indirect=True)


def terminate_own_connection(session) -> None:
    """PostgreSQL ends this session's backend, as an outage or a restart does mid-transaction: the
    statement raises OperationalError and the connection is gone."""
    session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))


@pytest.fixture
def db_url(request, tmp_path) -> Iterator[str]:
    """A fresh, migrated database on each backend (``pytest_generate_tests`` above picks them)."""
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

    @property
    def database_url(self) -> str:
        return self.env.get("STEADY_DATABASE_URL") or f"sqlite:///{(self.data_dir / 'steady.db').resolve()}"

    def study_ids(self) -> set[int]:
        """The ids of the (newest 500) studies on this server: a test on the shared one finds the study a
        command made as the one id that was not there before."""
        with self.client("admin") as c:
            r = c.get("/api/v1/studies", params={"limit": 500})
            assert r.status_code == 200, r.text
            return {s["id"] for s in r.json()["items"]}

    def new_tokens(self) -> dict[str, str]:
        """Fresh tokens, one per role, on this server's database (made in process)."""
        return create_tokens(self.database_url, upgrade=False)

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
    """A token made by ``steady token create`` in a subprocess, as an operator makes one."""
    out = subprocess.run(
        [sys.executable, "-m", "steady.server.cli", "token", "create", "--role", role, "--quiet"],
        env=env, cwd=REPO, capture_output=True, text=True, check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def create_tokens(database_url: str, sqlite_template: Path | None = None, *, upgrade: bool = True) -> dict[str, str]:
    """One token per role on a server's database, made in this process (what ``steady token create`` does,
    without three interpreter starts). An SQLite file that does not exist yet is copied from
    ``sqlite_template`` (migrated) when given; the database is upgraded to head unless ``upgrade=False``
    (a running server's)."""
    from steady.server.kit import migrate
    from steady.server.kit.auth import Role, create_token
    from steady.server.kit.db import Database

    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database and sqlite_template is not None:
        path = Path(url.database)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(sqlite_template, path)
    db = Database(database_url)
    try:
        if upgrade:
            migrate.upgrade(db.engine)
        tokens = {}
        with db.write() as session:
            for role in (Role.admin, Role.user, Role.worker):
                tokens[role.value] = create_token(session, name=f"{role.value}-token", role=role)[1]
        return tokens
    finally:
        db.dispose()


def start_live_server(data_dir: Path, database_url: str = "", *, sqlite_template: Path | None = None,
                      workers: int = 1, cls: type[LiveServer] | None = None, tokens: dict[str, str] | None = None,
                      **settings) -> LiveServer:
    """A started ``steady serve`` on a free port with its data in ``data_dir`` (created), tokens made in process."""
    data_dir.mkdir(parents=True, exist_ok=True)
    env = server_env(data_dir, database_url, **settings)
    if tokens is None:
        tokens = create_tokens(database_url or f"sqlite:///{(data_dir / 'steady.db').resolve()}", sqlite_template)
    server = (cls or LiveServer)(url=f"http://127.0.0.1:{free_port()}", data_dir=data_dir, env=env, tokens=tokens,
                                 log_path=data_dir / "server.log", workers=workers)
    server.start()
    return server


@pytest.fixture
def live_server_factory(tmp_path, sqlite_template):
    """A private ``steady serve`` per call, for a test that kills, restarts or configures its server:
    factory(database_url='', **settings) -> LiveServer, stopped when the test ends."""
    servers: list[LiveServer] = []

    def _start(database_url: str = "", **settings) -> LiveServer:
        server = start_live_server(tmp_path / f"server{len(servers)}", database_url,
                                   sqlite_template=sqlite_template, **settings)
        servers.append(server)
        return server

    yield _start
    for s in servers:
        s.stop()


SHARED_SERVER_SETTINGS = {"lease_seconds": 5, "heartbeat_seconds": 1, "reaper_interval_seconds": 1}
UNFINISHED = ("queued", "running")


@pytest.fixture(scope="session")
def shared_live_server(tmp_path_factory, sqlite_template) -> Iterator[LiveServer]:
    """The worker session's one ``steady serve`` (SQLite, fast leases): started at its first use."""
    server = start_live_server(tmp_path_factory.mktemp("live_server") / "data", sqlite_template=sqlite_template,
                               **SHARED_SERVER_SETTINGS)
    yield server
    server.stop()


def cancel_unfinished_studies(server: LiveServer) -> None:
    """Cancel every study still queued or running on ``server`` (as admin), so that its runs go to no
    later test's worker agent."""
    with server.client("admin") as c:
        offset = 0
        while True:
            page = c.get("/api/v1/studies", params={"limit": 200, "offset": offset})
            assert page.status_code == 200, page.text
            body = page.json()
            for study in body["items"]:
                if study["status"] in UNFINISHED:
                    r = c.post(f"/api/v1/studies/{study['id']}/cancel")
                    assert r.status_code in (200, 409), r.text
            offset += len(body["items"])
            if not body["items"] or offset >= body["total"]:
                return


@pytest.fixture
def live_server(shared_live_server) -> Iterator[LiveServer]:
    """The shared server (``shared_live_server``) with tokens of this test's own (so what it creates is owned
    by them); what the test leaves queued or running is cancelled when it ends. A test on it must not assume
    an empty server: other tests' studies are listed too. It must not stop the server (a private one:
    ``live_server_factory``)."""
    if not shared_live_server.proc or not shared_live_server.proc.running():
        shared_live_server.start()  # a crash must not fail every later test of the session
    server = dataclasses.replace(shared_live_server, tokens=shared_live_server.new_tokens())
    yield server
    cancel_unfinished_studies(server)


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


# --- the CLI in this process ------------------------------------------------------------------


@dataclass
class CliResult:
    """What ``steady ARGS`` did: its exit status and output (subprocess.CompletedProcess's field names)."""

    returncode: int
    stdout: str
    stderr: str


def run_cli_in_process(*args: str, env: dict[str, str], cwd: Path | str = REPO, input: str | None = None) -> CliResult:
    """``steady ARGS`` as ``steady.server.cli.main`` in this process, with exactly ``env`` as the environment,
    ``cwd`` as the working folder and ``input`` on stdin (not a terminal); all three are restored afterwards
    (commands such as ``token`` write STEADY_DATA_DIR into os.environ). A usage error's SystemExit is its status."""
    import contextlib
    import io

    from steady.server.cli import main

    saved_env, saved_cwd, saved_stdin = dict(os.environ), os.getcwd(), sys.stdin
    out, err = io.StringIO(), io.StringIO()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.stdin = io.StringIO(input or "")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdin = saved_stdin
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return CliResult(code, out.getvalue(), err.getvalue())
