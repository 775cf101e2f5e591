"""The run's stdout and stderr, copied to ``output.log`` by the agent as they arrive, with their arrival times.

A run used to write ``output.log`` itself, so the agent learnt of a line only when it next read the
file (every half second): too coarse to time a training step. Now the run writes into a pipe; one
thread per run reads it, appends each chunk to ``output.log`` at once (capture and the output tail
read that file as before) and remembers when the chunk arrived, as (end offset, monotonic time)
marks. :meth:`OutputTee.arrival` answers when the byte at an offset arrived, so the capture can date
a ``step N`` line to within a read of the pipe (microseconds, not half a second).

Bounded: at most :data:`MAX_MARKS` marks are held (the capture consumes them as it reads the file;
a run that floods the pipe faster than the capture reads loses the oldest marks, and those lines get
no time rather than a wrong one). The thread does no parsing, and a run that stops reading cannot
stall it: the thread only reads and appends, so it slows nothing but its own run.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections import deque

READ_BYTES = 64 * 1024
MAX_MARKS = 1 << 16


class OutputTee:
    """Copies a pipe's bytes to a file descriptor, marking when each chunk arrived."""

    def __init__(self, read_fd: int, out_fd: int) -> None:
        self.read_fd = read_fd
        self.out_fd = out_fd
        self.offset = 0  # bytes written to the file so far
        self._marks: deque[tuple[int, float]] = deque()
        self._forgotten = 0  # every byte before this offset has lost its mark
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="run-output", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self.read_fd], [], [], 0.2)
                if not ready:
                    if self._stop.is_set():
                        return
                    continue
                chunk = os.read(self.read_fd, READ_BYTES)
                if not chunk:  # every writer closed its end: the run and its children are gone
                    return
                now = time.monotonic()
                with self._lock:  # marked before it is written: a reader of the file never finds bytes without a mark
                    self.offset += len(chunk)
                    self._marks.append((self.offset, now))
                    if len(self._marks) > MAX_MARKS:
                        self._forgotten = self._marks.popleft()[0]
                view = memoryview(chunk)
                while view:
                    view = view[os.write(self.out_fd, view):]
        except OSError:
            return
        finally:
            for fd in (self.read_fd, self.out_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def arrival(self, end: int) -> float | None:
        """The monotonic time at which byte ``end - 1`` arrived (``end``: a line's end offset in the
        file), or None when unknown. Marks before ``end`` are dropped: offsets must be asked in order."""
        with self._lock:
            marks = self._marks
            while marks and marks[0][0] < end:
                self._forgotten = marks.popleft()[0]
            if end <= self._forgotten or not marks:
                return None
            return marks[0][1]

    def close(self, timeout: float = 2.0) -> None:
        """Wait for the copy to reach the end of the pipe; give up after ``timeout`` (a process that
        left the run's group may hold the pipe open forever)."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            self._stop.set()
            self.thread.join(1.0)
