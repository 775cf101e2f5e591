"""Produce on this thread, consume on another: reading the next piece of data overlaps with
computing on the last, on a machine with a second core (NumPy and the database drivers release the
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


def overlapped(items: Iterable[T], consume: Callable[[Iterator[T]], R], *, depth: int = 2) -> R:
    """``consume(iter(items))``, with ``items`` drawn on the calling thread (which keeps what it
    uses, such as a database session, to itself) and ``consume`` run on a thread of its own.

    At most ``depth`` items wait between the two. What either side raises is raised here, the
    producer's first. When ``consume`` stops early (it returned or raised), the producer stops at
    its next item."""
    handoff: queue.Queue = queue.Queue(maxsize=depth)
    done: Future = Future()
    ended = threading.Event()

    def taken() -> Iterator[T]:
        while (item := handoff.get()) is not _END:
            yield item
        ended.set()

    def run() -> None:
        try:
            result = consume(taken())
        except Exception as exc:  # noqa: BLE001 - handed to the caller, raised there by done.result()
            done.set_exception(exc)
        else:
            done.set_result(result)
        finally:
            if not done.done():  # what escaped was no Exception (SystemExit...): the caller is not left waiting
                done.set_exception(RuntimeError("the consumer of overlapped() stopped"))
            while not ended.is_set() and handoff.get() is not _END:  # never leave the producer blocked
                pass

    worker = threading.Thread(target=run, name="overlapped-consumer", daemon=True)
    worker.start()
    try:
        for item in items:
            if done.done():
                break
            handoff.put(item)
    finally:
        handoff.put(_END)
        worker.join()
    return done.result()
