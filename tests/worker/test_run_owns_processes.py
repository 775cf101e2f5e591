"""A run owns its processes: a daemon it starts (double fork, ``setsid``: out of its process group, its
parent gone) ends with the run, whether the run exits by itself or is killed."""

from __future__ import annotations

import os
import signal
import sys
import textwrap

import pytest

from tests.conftest import alive, wait_until
from steady.worker.agent.local import run_local

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a subreaper is Linux's")

DAEMON = textwrap.dedent("""
    import os, sys, time
    pidfile, beats, then = sys.argv[1], sys.argv[2], sys.argv[3]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # the daemon: its own session, its parent about to exit
            open(pidfile + ".tmp", "w").write(str(os.getpid()))
            os.rename(pidfile + ".tmp", pidfile)
            while True:
                with open(beats, "a") as f:
                    f.write("x")
                time.sleep(0.02)
        os._exit(0)
    os.wait()
    while not os.path.exists(pidfile):
        time.sleep(0.01)
    print("step 0 loss 1.0", flush=True)
    if then == "hang":
        time.sleep(600)
""")


@pytest.mark.parametrize("then, limit, ok", [("exit", 60, True), ("hang", 2, False)])
def test_a_double_forked_daemon_ends_with_its_run(tmp_path, then, limit, ok):
    script, pidfile, beats = tmp_path / "daemon.py", tmp_path / "daemon.pid", tmp_path / "beats"
    script.write_text(DAEMON)
    spec = {"framework": "torch", "seed": 0, "determinism": "none", "time_limit_s": limit,
            "command": ["python", "-S", str(script), str(pidfile), str(beats), then]}  # -S: no shim, no torch
    r = run_local(spec, work_dir=str(tmp_path / "run"), device="cpu")
    pid = int(pidfile.read_text())
    try:
        assert r.ok is ok, (r.error, r.stderr_tail)
        assert ok or r.failure_kind == "timeout"
        assert r.series["loss"] == ([0], [1.0])
        wait_until(lambda: not alive(pid), 5, interval=0.02, what="the run's daemon to end with its run")
        size = beats.stat().st_size
        wait_until(lambda: beats.stat().st_size == size, 1, interval=0.2, what="nothing writing after the run")
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
