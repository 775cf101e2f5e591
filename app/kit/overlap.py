"""Produce on this thread, consume on others: reading the next piece of data overlaps with
computing on the last ones, on a machine with more cores (NumPy and the database drivers release the
GIL for their long calls)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

_END = object()


def overlapped(items: Iterable[T], consume: Callable[[Iterator[T]], R], *, depth: int = 2,
               consumers: int = 1) -> list[R]:
    """``consume(...)`` on ``consumers`` threads of its own, each given an iterator over its share of
    ``items`` (drawn on the calling thread, which keeps what it uses, such as a database session, to
    itself; each item goes to whichever consumer asks first); their results, in thread order.

    At most ``depth`` items wait between the two sides. What either side raises is raised here, the
    producer's first. When a consumer stops early (it returned or raised before the items ran out), the
    producer stops at its next item."""
    handoff: queue.Queue = queue.Queue(maxsize=depth)
    stopped = threading.Event()

    def run(done: Future) -> None:
        ended = False

        def taken() -> Iterator[T]:
            nonlocal ended
            while (item := handoff.get()) is not _END:
                yield item
            ended = True

        try:
            result = consume(taken())
        except Exception as exc:  # noqa: BLE001 - handed to the caller, raised there by done.result()
            done.set_exception(exc)
        else:
            done.set_result(result)
        finally:
            if not done.done():  # what escaped was no Exception (SystemExit...): the caller is not left waiting
                done.set_exception(RuntimeError("a consumer of overlapped() stopped"))
            if not ended:
                stopped.set()
                while handoff.get() is not _END:  # never leave the producer blocked
                    pass

    results: list[Future] = [Future() for _ in range(consumers)]
    threads = [threading.Thread(target=run, args=(done,), name=f"overlapped-consumer-{i}", daemon=True)
               for i, done in enumerate(results)]
    for thread in threads:
        thread.start()
    try:
        for item in items:
            if stopped.is_set():
                break
            handoff.put(item)
    finally:
        for _ in threads:  # one end for each consumer
            handoff.put(_END)
        for thread in threads:
            thread.join()
    return [done.result() for done in results]
