"""The background loop (reaper, dispatcher, report cacher): driven on this thread by an injected wait."""

from __future__ import annotations

import logging
import random
import sqlite3

import pytest
import sqlalchemy.exc
from sqlalchemy import create_engine, text

from steady.server.kit.background import BackgroundLoop


class Script:
    """A wait that records the delays asked for and stops the loop after ``n`` waits."""

    def __init__(self, n: int) -> None:
        self.n, self.delays = n, []

    def __call__(self, seconds: float) -> bool:
        self.delays.append(seconds)
        return len(self.delays) > self.n


def test_ticks_every_interval_within_the_jitter():
    ticks = []
    wait = Script(5)
    loop = BackgroundLoop("t", lambda: ticks.append(1), interval=2.0, jitter=0.1, wait=wait, rand=random.Random(1))
    loop.run()
    assert len(ticks) == 5
    assert len(wait.delays) == 6
    assert all(1.8 <= d <= 2.2 for d in wait.delays)
    assert len(set(wait.delays)) > 1  # jittered, not a fixed period


def test_failures_back_off_exponentially_log_tracebacks_and_recover(caplog):
    outcomes = iter([ValueError("db down"), ValueError("db down"), ValueError("db down"), None, None])

    def tick() -> None:
        exc = next(outcomes)
        if exc is not None:
            raise exc

    wait = Script(5)
    loop = BackgroundLoop("reaper", tick, interval=1.0, jitter=0.0, max_backoff=5.0, wait=wait)
    with caplog.at_level(logging.ERROR, logger="steady"):
        loop.run()
    # before tick 1: 1; after 1, 2, 3 failures: 2, 4, 5 (capped); after a success: back to 1
    assert wait.delays == [1.0, 2.0, 4.0, 5.0, 1.0, 1.0]
    assert loop.failures == 0
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3
    assert all(r.exc_info is not None and "db down" in str(r.exc_info[1]) for r in errors)
    assert "3 in a row" in errors[-1].getMessage()


def test_an_unavailable_database_is_one_warning_line_and_a_bug_keeps_its_traceback(caplog):
    """A database outage is expected (the PostgreSQL outage test reads the server log for
    tracebacks): one warning line per try. A SQL bug, which SQLite also reports as OperationalError
    (here a real one: no such table), is still logged with its traceback."""
    engine = create_engine("sqlite://", connect_args={"timeout": 0})
    outage = sqlalchemy.exc.OperationalError("SELECT 1", {}, sqlite3.OperationalError("database is locked"))
    with engine.connect() as conn:
        try:
            conn.execute(text("SELECT * FROM no_such_table"))
        except sqlalchemy.exc.OperationalError as exc:
            bug = exc
    outcomes = iter([outage, bug, None])

    def tick() -> None:
        exc = next(outcomes)
        if exc is not None:
            raise exc

    loop = BackgroundLoop("reaper", tick, interval=1.0, jitter=0.0, wait=Script(3))
    with caplog.at_level(logging.WARNING, logger="steady"):
        loop.run()
    warning, error = [r for r in caplog.records if r.name == "steady"]
    assert warning.levelno == logging.WARNING and warning.exc_info is None
    assert "database unavailable" in warning.getMessage() and "database is locked" in warning.getMessage()
    assert error.levelno == logging.ERROR and error.exc_info is not None and "no_such_table" in str(error.exc_info[1])


def test_stop_ends_the_loop_before_the_next_tick():
    ticks = []
    loop = BackgroundLoop("t", lambda: ticks.append(1), interval=1.0, wait=lambda s: False)

    def tick_then_stop() -> None:
        ticks.append(1)
        loop.stop()

    loop.tick = tick_then_stop
    loop.run()
    assert ticks == [1] and loop.stopping


def test_a_real_thread_stops_promptly():
    loop = BackgroundLoop("t", lambda: None, interval=3600.0)
    loop.start()
    loop.stop(timeout=5)
    assert not loop._thread.is_alive()


@pytest.mark.parametrize("kwargs", [{"interval": 0}, {"interval": 1.0, "jitter": 1.0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        BackgroundLoop("t", lambda: None, **kwargs)
