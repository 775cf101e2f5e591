"""``steady serve --workers N``: the worker processes die with their supervisor."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.conftest import alive, wait_until

pytestmark = pytest.mark.postgres


def _children(pid: int) -> set[int]:
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out |= {int(c) for c in text}
    return out




def test_sigkill_of_the_supervisor_ends_its_workers_and_the_port_is_free(cluster, pg_database):
    (server,) = cluster(pg_database, workers=2)
    supervisor = server.proc.pid
    wait_until(lambda: len([c for c in _children(supervisor) if alive(c)]) >= 2, timeout=60,
               what="two uvicorn worker processes")
    workers = {c for c in _children(supervisor) if alive(c)}
    os.kill(supervisor, signal.SIGKILL)
    server.proc.wait(timeout=30)
    wait_until(lambda: not any(alive(w) for w in workers), timeout=60, what="workers gone after SIGKILL")
    with pytest.raises(httpx.HTTPError):
        httpx.get(server.url + "/healthz", timeout=2)
    server.start()  # same port: "address in use" before the fix
    assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
