"""An upload whose client stops sending is answered 408 once nothing came for STEADY_UPLOAD_STALL_SECONDS,
and its spool file is removed (#51: such an upload stayed open over 200 s, holding a connection and a file).
A raw socket against a real ``steady serve``: the client declares 1 MB, sends 10 bytes and waits."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from tests.conftest import wait_until

SHA = "a" * 64


def test_a_stalled_upload_is_answered_408_and_leaves_no_spool_file(live_server_factory):
    server = live_server_factory(upload_stall_seconds=1)
    url = urlsplit(server.url)
    with socket.create_connection((url.hostname, url.port), timeout=60) as s:
        s.sendall((f"PUT /api/v1/code/{SHA} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.tokens['user']}\r\n"
                   "Content-Type: application/gzip\r\nContent-Length: 1000000\r\n\r\n").encode() + b"0123456789")
        answer = s.recv(65536).decode(errors="replace")  # waits up to 60 s for the server to give up at 1 s
    assert answer.startswith("HTTP/1.1 408"), answer[:300]
    assert "STEADY_UPLOAD_STALL_SECONDS" in answer
    code = server.data_dir / "code"
    wait_until(lambda: not list(code.glob(".upload-*")), 30, what="the spool file to be removed")
