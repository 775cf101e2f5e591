"""app/web/devserver.py: the one way the demo, the tests and the benchmarks run a server in a child process."""

from __future__ import annotations

import os
import signal
import socket
import sys
import textwrap

import httpx
import pytest

from steady.server.web.devserver import ServerProcess, ServerStartError, free_port, port_free, serve_argv
from tests.conftest import alive, wait_until

# A stand-in server: answers /healthz, and starts a child in its process group (like uvicorn's workers).
FAKE_SERVER = textwrap.dedent("""
    import http.server, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("child", child.pid, flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def test_free_port_is_bindable_and_port_free_sees_a_listener():
    port = free_port()
    assert port_free(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not port_free(port)


def test_serve_argv_runs_this_interpreters_cli():
    argv = serve_argv(8123, workers=3)
    assert argv[:4] == [sys.executable, "-m", "steady.server.cli", "serve"]
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--workers") + 1] == "3"


def test_start_waits_for_healthz_and_stop_ends_the_whole_process_group(tmp_path):
    port = free_port()
    log = tmp_path / "server.log"
    with ServerProcess([sys.executable, "-c", FAKE_SERVER, str(port)], url=f"http://127.0.0.1:{port}",
                       log_path=log) as server:
        assert httpx.get(server.url + "/healthz").status_code == 200
        child = int(wait_until(lambda: log.read_text().split()[1:2], timeout=30, what="the child's pid")[0])
        assert alive(child) and os.getpgid(child) == server.pid
    assert not server.running()
    wait_until(lambda: not alive(child), timeout=10, what="the child to end with its group")


def test_a_server_that_exits_reports_its_status_and_log(tmp_path):
    port = free_port()
    server = ServerProcess([sys.executable, "-c", "print('cannot open the database'); raise SystemExit(3)"],
                           url=f"http://127.0.0.1:{port}", log_path=tmp_path / "server.log")
    with pytest.raises(ServerStartError, match=r"(?s)status 3.*cannot open the database"):
        server.start()


def test_a_server_that_never_answers_is_stopped_at_the_deadline(tmp_path):
    port = free_port()
    server = ServerProcess([sys.executable, "-c", "import time; print('stuck', flush=True); time.sleep(600)"],
                           url=f"http://127.0.0.1:{port}", log_path=tmp_path / "server.log", start_timeout=1)
    with pytest.raises(ServerStartError, match=r"(?s)within 1 s.*stuck"):
        server.start()
    assert not server.running()
    assert server.proc.returncode == -signal.SIGTERM


def test_start_healthy_false_returns_on_any_http_answer(tmp_path):
    # 503 from /healthz (a broken database) is an answer: the caller wants to inspect it.
    port = free_port()
    script = FAKE_SERVER.replace('200 if self.path == "/healthz" else 404', "503")
    server = ServerProcess([sys.executable, "-c", script, str(port)], url=f"http://127.0.0.1:{port}",
                           log_path=tmp_path / "server.log", start_timeout=30)
    with server.start(healthy=False):
        assert httpx.get(server.url + "/healthz").status_code == 503
        with pytest.raises(ServerStartError, match="did not answer 200"):
            server.wait_ready(timeout=0.3)
    assert not server.running()
