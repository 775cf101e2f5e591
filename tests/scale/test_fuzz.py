"""Fuzz the whole OpenAPI surface with schemathesis: no 5xx, and responses match the schema.

One real ``steady serve`` (SQLite) seeded with a study, a worker and a leased run, so ids
like 1 exist; an admin token (admitted by every route) authenticates every case; the admin
token gets a high id so a fuzzed ``DELETE /api/v1/tokens/{id}`` does not revoke it. Bounded:
STEADY_FUZZ_EXAMPLES examples per operation (default 12).
"""

from __future__ import annotations

import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.conftest import LiveServer, free_port, server_env
from tests.api.helpers import spec

pytestmark = pytest.mark.slow
EXAMPLES = int(os.environ.get("STEADY_FUZZ_EXAMPLES", "12"))


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    from steady.server.kit import migrate
    from steady.server.kit.auth import Role, create_token
    from steady.server.kit.db import Database

    data_dir = tmp_path_factory.mktemp("fuzz")
    url = f"sqlite:///{data_dir / 'steady.db'}"
    db = Database(url)
    migrate.upgrade(db.engine)
    tokens = {}
    with db.write() as s:
        for i in range(300):
            create_token(s, name=f"filler-{i}", role=Role.user)
        for role in Role:
            tokens[role.value] = create_token(s, name=f"fuzz-{role.value}", role=role)[1]
    db.dispose()
    server = LiveServer(url=f"http://127.0.0.1:{free_port()}", data_dir=data_dir, env=server_env(data_dir, url),
                        tokens=tokens, log_path=data_dir / "server.log")
    server.start()
    with server.client("user") as c:
        c.post("/api/v1/studies", json=spec(seeds=[0, 1], repeats=1, determinism=["seeded"])).raise_for_status()
    with server.client("worker") as c:
        wid = c.post("/api/v1/workers/register", json={"name": "w", "labels": ["torch"]}).json()["worker_id"]
        c.post(f"/api/v1/workers/{wid}/lease", json={"worker_id": wid}).raise_for_status()
    yield server
    server.stop()


@schemathesis.serializer("application/gzip")
def _gzip_body(ctx, value) -> bytes:
    """Code archives (PUT /api/v1/code/{sha256}) are raw bytes: send the generated string as is
    (the server must refuse a body that is not a safe archive with that digest, never 5xx)."""
    return value if isinstance(value, bytes) else str(value).encode()


def test_api_fuzz(fuzz_server):
    """Every operation in the OpenAPI document, EXAMPLES generated cases each.

    (schemathesis' pytest plugin does not load under pytest 9, so operations are driven
    through their Hypothesis strategies directly.)
    """
    from hypothesis import given

    api = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    headers = {"Authorization": f"Bearer {fuzz_server.tokens['admin']}"}
    failures: list[str] = []
    operations = 0
    calls = [0]
    for result in api.get_all_operations():
        operation = result.ok()
        operations += 1

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def run(case) -> None:
            calls[0] += 1
            case.call_and_validate(base_url=fuzz_server.url, headers=headers,
                                   checks=[not_a_server_error, response_schema_conformance], timeout=30)

        try:
            run()
        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - collect every operation's failure
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:1500]}")
    assert operations >= 20 and calls[0] >= 3 * operations, (operations, calls)
    assert not failures, "\n\n".join(failures)


def test_fuzz_server_survived(fuzz_server):
    assert httpx.get(fuzz_server.url + "/healthz").status_code == 200
    log = fuzz_server.log_path.read_text()
    assert "Traceback" not in log, log[-3000:]
