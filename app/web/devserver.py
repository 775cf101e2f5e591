"""``steady serve`` in a child process: one implementation for the demo, the tests and the benchmarks.

Start it in its own process group, wait until ``/healthz`` answers (with a deadline, and the
server's log in the error when it does not), stop it by signalling the whole group (uvicorn's
worker processes included), wait, and kill what is left. Standard library and httpx only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

LOG_TAIL = 3000  # characters of the server's log quoted in an error


class ServerStartError(RuntimeError):
    """The server exited, or did not answer ``/healthz`` before the deadline; the message ends with its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def serve_argv(port: int, *, workers: int = 1, log_level: str = "warning") -> list[str]:
    """The command line of ``steady serve`` on ``port`` with this interpreter."""
    return [sys.executable, "-m", "steady.server.cli", "serve", "--port", str(port), "--workers", str(workers),
            "--log-level", log_level]


def stop_group(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
    """Signal ``proc``'s process group (it must lead one: ``start_new_session=True``), wait up to
    ``timeout`` seconds, then SIGKILL the group and reap the leader. A finished process is left alone."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def log_tail(path: Path | None, chars: int = LOG_TAIL) -> str:
    if path is None or not path.exists():
        return ""
    return path.read_text(errors="replace")[-chars:]


class ServerProcess:
    """A server child process in its own process group, used as a context manager or with start()/stop().

    ``url`` is where ``/healthz`` is polled; stdout and stderr go to ``log_path`` (appended, so a
    restart keeps the earlier log). ``start(healthy=False)`` returns at the first HTTP answer of
    any status (e.g. a server that reports a broken database with 503).
    """

    def __init__(self, argv: Sequence[str], *, url: str, log_path: Path, env: Mapping[str, str] | None = None,
                 cwd: Path | str | None = None, start_timeout: float = 60.0, stop_timeout: float = 15.0) -> None:
        self.argv = list(argv)
        self.url = url.rstrip("/")
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the server was not started")
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        """The exit status, once the process (the group's leader) has exited."""
        if self.proc is None:
            raise RuntimeError("the server was not started")
        return self.proc.wait(timeout=timeout)

    def start(self, *, healthy: bool = True) -> ServerProcess:
        if self.running():
            raise RuntimeError(f"the server at {self.url} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self.wait_ready(healthy=healthy)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, *, healthy: bool = True, timeout: float | None = None) -> None:
        """Until ``/healthz`` answers 200 (any answer with ``healthy=False``); ServerStartError with the
        log when the process exits or the deadline passes."""
        import httpx

        timeout = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise ServerStartError(f"the server exited (status {code}) before answering {self.url}/healthz:\n"
                                       + log_tail(self.log_path))
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200 or not healthy:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                raise ServerStartError(f"{self.url}/healthz did not answer 200 within {timeout:g} s:\n"
                                       + log_tail(self.log_path))
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        stop_group(self.proc, sig, self.stop_timeout)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def log(self) -> str:
        return log_tail(self.log_path, chars=10**9)

    def __enter__(self) -> ServerProcess:
        return self if self.running() else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
