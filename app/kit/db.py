"""Engine, sessions and the schema check.

Reads and writes get different session types (``ReadSession`` / ``WriteSession``), so a GET
handler cannot write by accident: services declare ``WriteSession`` for what changes rows, and
a type checker refuses a ``ReadSession`` passed to them. At run time a read session refuses
INSERT, UPDATE, DELETE and flushes (``ReadOnlySessionError``) and is always rolled back. A write session
commits when the request succeeds and rolls back on error; services ``flush()`` and never
``commit()``. On SQLite, write transactions start with ``BEGIN IMMEDIATE`` so concurrent
writers queue on the busy timeout instead of failing with "database is locked".

SQLite has one writer at a time, and a writer waiting in its busy handler sleeps in steps
(up to 100 ms) and polls, so with many concurrent writers most of their time is spent
asleep while the lock is free. ``write(queue=True)`` first takes a lock of this process, so
writers of one API process wait their turn in line and start the moment it is free; the
busy handler then only arbitrates between processes (and writers that do not queue). Only
code that holds the session in one thread from start to commit may queue: the group committer
of metric batches (``steady.server.lifecycle.committer``), heartbeats and background jobs, not a FastAPI
dependency (whose setup, endpoint and teardown may run on different pool threads, so waiters could take every thread the lock
holder needs to finish).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NewType

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from steady.server.kit.errors import Unavailable

ReadSession = NewType("ReadSession", Session)
WriteSession = NewType("WriteSession", Session)


class ReadOnlySessionError(RuntimeError):
    """A write attempted in a read session (a bug: it would be rolled back, silently lost)."""


def _refuse_writes(factory: sessionmaker) -> None:
    @event.listens_for(factory, "do_orm_execute")
    def _no_dml(state):
        if state.is_insert or state.is_update or state.is_delete:
            raise ReadOnlySessionError(f"a write in a read session: {state.statement}")

    @event.listens_for(factory, "before_flush")
    def _no_flush(session, _context, _instances):
        if session.new or session.dirty or session.deleted:
            raise ReadOnlySessionError("a flush of changed objects in a read session")

_WRITE_OPTION = "steady_write"
SQLITE_BUSY_TIMEOUT_MS = 60_000


# A pool without a check at checkout replaces its connections after this long, before an idle timeout
# of the server or a proxy in between would close them.
RECYCLE_SECONDS = 300


def make_engine(url: str, *, sqlite_synchronous: str = "FULL", pool_size: int | None = None,
                max_overflow: int | None = None, pre_ping: bool = True) -> Engine:
    """An engine and its connection pool (default: 8 + 16 on SQLite, 10 + 20 on PostgreSQL).

    ``pre_ping`` (PostgreSQL): a round trip at every checkout that replaces a connection the server
    closed. Without it the pool recycles its connections every ``RECYCLE_SECONDS``, and one closed
    under it (the server restarted) fails the statement that finds it, which also empties the pool."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
            pool_size=8 if pool_size is None else pool_size,
            max_overflow=16 if max_overflow is None else max_overflow,
        )
        _configure_sqlite(engine, sqlite_synchronous)
        return engine
    return create_engine(url, pool_pre_ping=pre_ping, pool_recycle=-1 if pre_ping else RECYCLE_SECONDS,
                         pool_size=10 if pool_size is None else pool_size,
                         max_overflow=20 if max_overflow is None else max_overflow)


def _configure_sqlite(engine: Engine, synchronous: str) -> None:
    if synchronous not in ("FULL", "NORMAL"):
        raise ValueError(f"STEADY_SQLITE_SYNCHRONOUS must be FULL or NORMAL, not {synchronous!r}")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Take over transaction control from pysqlite so BEGIN is ours to emit.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        # FULL (default): the WAL is fsynced at every commit, so an acknowledged write survives
        # power loss. NORMAL: survives a process crash only (docs/deploy.md, "Durability").
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        write = conn.get_execution_options().get(_WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


class _Shared:
    """What every ``Database`` on one URL in a process shares: the integrity verdict and the SQLite write queue."""

    def __init__(self, is_sqlite: bool) -> None:
        self.corruption: str | None = None
        self.write_queue = threading.Lock() if is_sqlite else None


class Database:
    """Owns the engine and the two session factories."""

    def __init__(self, url: str, *, sqlite_synchronous: str = "FULL", pool_size: int | None = None,
                 max_overflow: int | None = None, pre_ping: bool = True, _shared: _Shared | None = None) -> None:
        self.url = url
        self._synchronous = sqlite_synchronous
        self.engine = make_engine(url, sqlite_synchronous=sqlite_synchronous, pool_size=pool_size,
                                  max_overflow=max_overflow, pre_ping=pre_ping)
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        write_engine = self.engine.execution_options(**{_WRITE_OPTION: True})
        self._read = sessionmaker(self.engine, expire_on_commit=False, autoflush=False)
        _refuse_writes(self._read)
        self._write = sessionmaker(write_engine, expire_on_commit=False)
        self._shared = _shared or _Shared(self.is_sqlite)
        self._write_queue = self._shared.write_queue

    @property
    def corruption(self) -> str | None:
        """Why the SQLite file failed its integrity check (None: it did not)."""
        return self._shared.corruption

    def own_pool(self, connections: int, *, pre_ping: bool = True) -> Database:
        """A ``Database`` on the same URL with a connection pool of its own (``connections``, no overflow),
        sharing this one's integrity verdict and SQLite write queue: capacity that no request on this
        one's pool can take (the worker protocol's, ``steady.server.kit.capacity``)."""
        return Database(self.url, sqlite_synchronous=self._synchronous, pool_size=connections, max_overflow=0,
                        pre_ping=pre_ping, _shared=self._shared)

    def check_integrity(self) -> str | None:
        """SQLite: ``PRAGMA quick_check`` (every page and index structure, O(file size)); on failure
        writes are refused and /healthz answers 503 until the file is restored. None when healthy."""
        if not self.is_sqlite:
            return None
        try:
            with self.engine.connect() as conn:
                rows = [r[0] for r in conn.exec_driver_sql("PRAGMA quick_check").fetchall()]
            problem = None if rows == ["ok"] else "; ".join(rows[:3])
        except DBAPIError as exc:
            problem = str(exc.orig)
        if problem:
            self.mark_corrupt(problem)
        return problem

    def mark_corrupt(self, problem: str) -> None:
        self._shared.corruption = problem

    @contextmanager
    def read(self) -> Iterator[ReadSession]:
        session = self._read()
        try:
            yield ReadSession(session)
        finally:
            session.rollback()
            session.close()

    @contextmanager
    def write(self, *, queue: bool = False) -> Iterator[WriteSession]:
        """A write session, committed on success. ``queue``: on SQLite, wait for this process's
        write lock first (see the module docstring); only for a session used in one thread."""
        if self.corruption:
            raise Unavailable(f"the database file failed its integrity check ({self.corruption}); writes are "
                              "refused: stop the server and restore the file from a backup")
        queued = self._write_queue if queue else None
        if queued is not None and not queued.acquire(timeout=SQLITE_BUSY_TIMEOUT_MS / 1000):
            raise Unavailable("the database stayed busy with other writes; retry shortly")
        try:
            session = self._write()
            try:
                yield WriteSession(session)
                session.commit()
            except BaseException:
                session.rollback()
                raise
            finally:
                session.close()
        finally:
            if queued is not None:
                queued.release()

    def dispose(self) -> None:
        self.engine.dispose()

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))


_SQLITE_ERROR = 1


def sqlite_sql_error(exc: DBAPIError) -> bool:
    """SQLite reports SQL errors (no such table or column, a syntax error) as OperationalError with
    the generic SQLITE_ERROR code: a bug in the statement, not a busy or missing database."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == _SQLITE_ERROR


def database_message(exc: BaseException) -> str:
    """The driver's own message for a database error, without the statement and parameters
    SQLAlchemy appends (a batch's packed points, say): what a log line should say."""
    return str(getattr(exc, "orig", None) or exc).strip()


def unavailable(exc: BaseException) -> bool:
    """The database is busy, down or unreachable (a retry may succeed), as opposed to a bug: locked,
    busy, connection refused or lost, every pooled connection taken."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, PoolTimeout):
        return True
    return isinstance(exc, OperationalError) and not sqlite_sql_error(exc)
