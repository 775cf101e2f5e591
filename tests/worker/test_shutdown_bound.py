"""Shutdown that ends: a SIGTERMed agent whose server is gone kills its run and exits within its grace
plus its report timeout, instead of retrying its reports for minutes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx

from tests.conftest import alive, free_port, wait_until

REPO = Path(__file__).resolve().parents[2]


class Forwarder:
    """A TCP forwarder in front of the server; :meth:`close` makes the server gone for whoever used it
    (connections cut, the port refusing), while the shared server itself runs on."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", free_port()))
        self.port = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(): close() alone would not
        except OSError:
            pass
        self.listener.close()
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass


def test_sigterm_with_the_server_gone_exits_within_grace_plus_report_timeout(live_server, tmp_path):
    pidfile = tmp_path / "run.pid"
    script = tmp_path / "forever.py"
    script.write_text(textwrap.dedent(f"""
        import os, time
        open({str(pidfile)!r}, "w").write(str(os.getpid()))
        print("step 0 loss 1.0", flush=True)
        time.sleep(600)
    """))
    with httpx.Client(base_url=live_server.url, headers={"Authorization": f"Bearer {live_server.tokens['user']}"},
                      timeout=30) as http:
        r = http.post("/api/v1/studies", json={
            "name": "shutdown-bound", "metrics": ["loss"], "seeds": [0], "repeats": 1, "determinism": ["none"],
            "workload": {"framework": "torch", "command": ["python", "-S", str(script)]}})  # -S: no torch
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        forwarder = Forwarder(int(live_server.url.rsplit(":", 1)[1]))
        grace, report = 1.0, 2.0
        log = tmp_path / "worker.log"
        with open(log, "wb") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "steady.worker", "--server", f"http://127.0.0.1:{forwarder.port}",
                 "--study", str(sid), "--poll-max", "0.5", "--grace", str(grace), "--report-timeout", str(report),
                 "--work-dir", str(tmp_path / "w")],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "STEADY_TOKEN": live_server.tokens["worker"]})
        try:
            wait_until(pidfile.exists, 60, what=f"the run to start\n{log.read_text()[-3000:]}")
            run_pid = int(pidfile.read_text())
            forwarder.close()  # the server is gone, as far as the worker can tell
            t0 = time.monotonic()
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=grace + report + 20)
            except subprocess.TimeoutExpired:
                pass
            took = time.monotonic() - t0
            assert worker.poll() is not None, f"the worker still runs {took:.0f} s after SIGTERM\n{log.read_text()[-3000:]}"
            assert took < grace + report + 3, f"exited after {took:.1f} s\n{log.read_text()[-3000:]}"
            assert not alive(run_pid)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
            http.post(f"/api/v1/studies/{sid}/cancel")
