"""Group commit: the metric batches of one API process share transactions and fsyncs.

With SQLite's ``synchronous=FULL`` every commit waits for an fsync of the WAL (milliseconds), and
one write transaction runs at a time, so committing each batch alone caps a process at one
batch per fsync. Here each request hands its work to the process's one committer thread and
waits; the thread takes everything queued, runs every piece of work in one write transaction,
commits once, and only then answers every request. So:

* a request is answered only after its rows are committed (durably: the commit is the fsync);
* a piece of work that raises (lease lost, limits, a database error of its own) is rolled back
  and answered with its error; the others in the transaction are unaffected. A group runs first
  without savepoints (each costs two statements per piece, and pieces rarely fail): when a piece
  raises, that transaction is rolled back, nothing of it stored, and the group runs again with each
  piece in a savepoint of its own, which keeps what the others wrote. A piece alone in its group needs
  no savepoint: its transaction is its own;
* a database that is lost or busy while a piece runs fails the transaction, not the piece (the
  session cannot go on: committing it would raise PendingRollbackError, answered 500);
* when the transaction itself fails (at commit, or the database is refused), nothing of it was
  stored: each piece is run again in a transaction of its own, so one cause fails only itself.

Work runs in the committer's thread, inside ``Database.write(queue=True)``: in line with the
process's other writers (heartbeats, the lease reaper), on SQLite and PostgreSQL alike.

On PostgreSQL a metric batch locks its run's row until commit, and several API processes commit groups at
once: a group runs its pieces in the order of their ``order`` key (the run's id; submission order among
equal keys), so two groups take their runs' locks in one order and never wait on each other in a cycle.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from steady.server.kit.db import Database, database_message, unavailable

T = TypeVar("T")
log = logging.getLogger(__name__)

MAX_GROUP = 128  # pieces of work per transaction at most


@dataclass(frozen=True)
class _Item:
    work: Callable[[Session], Any]
    future: Future
    order: int = 0


class GroupCommitter:
    def __init__(self, database: Database, *, max_group: int = MAX_GROUP) -> None:
        self.database = database
        self.max_group = max_group
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="steady-group-commit", daemon=True)
        self._stopped = False
        self.transactions = 0  # committed or failed group transactions (for tests and benchmarks)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish what is queued, then stop; work submitted afterwards is refused."""
        self._stopped = True
        self._queue.put(None)
        self._thread.join(timeout=30)

    def submit(self, work: Callable[[Session], T], *, order: int = 0) -> Future[T]:
        """Run ``work(session)`` in the next group transaction; the future resolves after its commit.
        ``order``: pieces of one group run by this key (the row the piece locks first, e.g. its run's id)."""
        future: Future[T] = Future()
        if self._stopped:
            future.set_exception(RuntimeError("the server is shutting down"))
            return future
        self._queue.put(_Item(work, future, order))
        return future

    async def run(self, work: Callable[[Session], T], *, order: int = 0) -> T:
        return await asyncio.wrap_future(self.submit(work, order=order))

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            group = [item]
            stop = False
            while len(group) < self.max_group:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                group.append(nxt)
            live = [it for it in group if it.future.set_running_or_notify_cancel()]
            live.sort(key=lambda it: it.order)  # stable: submission order among equal keys
            if live:
                self._commit(live)
            if stop:
                return

    def _commit(self, group: list[_Item]) -> None:
        """Run the group in one transaction, no savepoints; when a piece raises, again with savepoints."""
        results: list[Any] = []
        piece_failed = False
        try:
            with self.database.write(queue=True) as session:
                for it in group:
                    try:
                        results.append(it.work(session))
                    except Exception as exc:
                        piece_failed = not unavailable(exc)
                        raise
        except Exception as exc:  # noqa: BLE001 - the transaction was rolled back: none of it was stored
            self.transactions += 1
            if len(group) == 1:  # its own error (its transaction was its own)
                group[0].future.set_exception(exc)
            elif piece_failed:
                self._commit_with_savepoints(group)
            else:  # a lost or busy database, or the commit failed
                self._each_alone(group, exc)
            return
        except BaseException as exc:  # the thread is going down: answer everyone before it does
            self._going_down(group, exc)
            raise
        self.transactions += 1
        for it, value in zip(group, results, strict=True):
            it.future.set_result(value)

    def _commit_with_savepoints(self, group: list[_Item]) -> None:
        outcomes: list[tuple[_Item, bool, Any]] = []
        try:
            with self.database.write(queue=True) as session:
                for it in group:
                    try:
                        with session.begin_nested():
                            outcomes.append((it, True, it.work(session)))
                    except Exception as exc:  # this piece's own error, answered to it alone
                        if unavailable(exc):  # a lost or busy database ends the transaction, not just the savepoint
                            raise
                        outcomes.append((it, False, exc))
        except Exception as exc:  # noqa: BLE001 - the transaction failed: none of it was stored
            self.transactions += 1
            self._each_alone(group, exc)
            return
        except BaseException as exc:
            self._going_down(group, exc)
            raise
        self.transactions += 1
        for it, ok, value in outcomes:
            if ok:
                it.future.set_result(value)
            else:
                it.future.set_exception(value)

    def _each_alone(self, group: list[_Item], exc: Exception) -> None:
        """A group's transaction failed: each piece again in a transaction of its own, so one cause fails only itself."""
        log.warning("group commit of %d batches failed (%s); committing each alone", len(group), database_message(exc))
        for it in group:
            self._commit([it])

    @staticmethod
    def _going_down(group: list[_Item], exc: BaseException) -> None:
        for it in group:
            if not it.future.done():
                it.future.set_exception(RuntimeError(f"the committer stopped: {exc!r}"))
