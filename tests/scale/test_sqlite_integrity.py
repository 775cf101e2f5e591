"""A SQLite file with corrupted pages: detected on start, health says so, writes are refused."""

from __future__ import annotations

import os

import httpx

from tests.scale.conftest import create_study
from tests.api.helpers import error_msg


def test_corrupt_sqlite_file_is_detected_and_writes_refused(cluster, tmp_path):
    db_path = tmp_path / "shared" / "steady.db"
    (server,) = cluster(f"sqlite:///{db_path}")
    for _ in range(3):
        create_study(server, 50)
    server.stop()  # the last connection checkpoints the WAL into the main file
    assert not (db_path.parent / "steady.db-wal").exists() or (db_path.parent / "steady.db-wal").stat().st_size == 0
    page = 4096
    size = db_path.stat().st_size
    assert size > 8 * page
    with open(db_path, "r+b") as f:  # keep the header page, scribble over the b-tree pages behind it
        for offset in range(2 * page, size, 3 * page):
            f.seek(offset)
            f.write(os.urandom(page // 2))

    server.start(healthy=False)
    health = httpx.get(server.url + "/healthz", timeout=10)
    assert health.status_code == 503 and health.json()["status"] == "database corrupt"
    with server.client("user") as c:
        r = c.post("/api/v1/studies", json={"name": "after", "kind": "external", "metrics": [{"name": "loss"}]})
    assert r.status_code == 503 and "integrity check" in error_msg(r)
