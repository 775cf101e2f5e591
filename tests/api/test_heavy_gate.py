"""Heavy reads (report, bands, compare, a run's series) are admitted a few at a time per token and per
process; one more is answered 429 at once with Retry-After (docs/deploy.md, "Capacity"). The end-to-end
shape, with a real agent beside the storm: tests/scale/test_capacity.py."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from steady.server.kit.auth import hash_token
from steady.server.kit.capacity import HeavyGate
from steady.server.kit.errors import TooManyRequests
from steady.server.models import ApiToken
from tests.api.helpers import spec
from tests.conftest import SQLITE_ONLY

pytestmark = SQLITE_ONLY


def test_the_gate_counts_per_token_and_in_all():
    gate = HeavyGate(per_user=2, total=3)
    a1, a2 = gate.enter(1), gate.enter(1)
    with pytest.raises(TooManyRequests) as refused:
        gate.enter(1)
    assert refused.value.retry_after_s >= 1 and "STEADY_HEAVY_PER_USER" in refused.value.message
    b1 = gate.enter(2)
    with pytest.raises(TooManyRequests, match="STEADY_HEAVY_TOTAL"):
        gate.enter(3)
    gate.leave(1, a1)
    assert gate.enter(3) and gate.in_progress() == 3
    for token, started in ((1, a2), (2, b1)):
        gate.leave(token, started)
    assert gate.in_progress() == 1


def test_a_heavy_read_past_the_tokens_limit_is_429_with_retry_after_and_others_pass(api):
    study = api.post("/api/v1/studies", json=spec()).json()["id"]
    with api.app.state.database.read() as s:
        token_id = s.scalar(select(ApiToken.id).where(ApiToken.token_hash == hash_token(api.tokens["user"])))
    gate = api.app.state.heavy_gate
    held = [gate.enter(token_id) for _ in range(gate.per_user)]  # this token's heavy reads in progress
    for path in (f"/api/v1/studies/{study}/report", f"/api/v1/studies/{study}/bands",
                 f"/api/v1/compare?baseline={study}&candidate={study}", "/api/v1/runs/1/metrics/loss"):
        r = api.get(path)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, (path, r.text)
        assert r.json()["detail"][0]["type"] == "too_many_heavy_reads"
    assert api.get(f"/api/v1/studies/{study}").status_code == 200  # a light read is not counted
    admin = api.get(f"/api/v1/studies/{study}/bands", role="admin")  # another token's heavy read passes
    assert admin.status_code != 429, admin.text
    for started in held:
        gate.leave(token_id, started)
    assert api.get(f"/api/v1/studies/{study}/bands").status_code != 429
    assert gate.in_progress() == 0  # each admitted read left the gate when answered


def test_the_cli_asks_again_after_retry_after(api):
    """`steady report` and the other reads wait their turn instead of failing: the CLI's client asks again
    after the Retry-After of a 429 (here the token's slots free up while it waits)."""
    import threading

    from steady.server.cli.client import Api, ApiError

    study = api.post("/api/v1/studies", json=spec()).json()["id"]
    with api.app.state.database.read() as s:
        token_id = s.scalar(select(ApiToken.id).where(ApiToken.token_hash == hash_token(api.tokens["user"])))
    gate = api.app.state.heavy_gate
    held = [gate.enter(token_id) for _ in range(gate.per_user)]
    cli = Api(server="http://testserver", token=api.tokens["user"])
    cli._http = api.client  # the app in process, with the CLI's own request logic
    api.client.headers["Authorization"] = f"Bearer {api.tokens['user']}"
    freed = threading.Event()

    def free() -> None:
        freed.wait(10)
        for started in held:
            gate.leave(token_id, started)

    releaser = threading.Thread(target=free)
    releaser.start()
    original = api.client.request
    answers: list[int] = []

    def first_refused(*args, **kwargs):
        r = original(*args, **kwargs)
        answers.append(r.status_code)
        freed.set()  # the first answer was the 429: free the slots while the client waits
        return r

    api.client.request = first_refused
    try:
        try:
            cli.get(f"/api/v1/studies/{study}/bands")
        except ApiError as exc:
            assert exc.status != 429, exc
    finally:
        api.client.request = original
        freed.set()
        releaser.join()
    assert answers[0] == 429 and answers[-1] != 429 and len(answers) >= 2, answers


def test_a_heavy_read_leaves_the_gate_before_its_answer_is_sent(api):
    """A client that reads one thing after another never meets its own earlier read: each read has left the
    gate by the time its last byte is sent, so the next one, sent on receipt, finds the token's slots free
    (one finished read still counted at that moment, on a loaded machine, refused a sequential reader)."""
    from starlette.testclient import TestClient

    study = api.post("/api/v1/studies", json=spec()).json()["id"]
    gate = api.app.state.heavy_gate
    counted_when_sent: list[int] = []

    async def watching(scope, receive, send):
        async def watched(message):
            if message["type"] == "http.response.body" and not message.get("more_body"):
                counted_when_sent.append(gate.in_progress())
            await send(message)

        await api.app(scope, receive, watched)

    client = TestClient(watching, headers={"Authorization": f"Bearer {api.tokens['user']}"})
    paths = (f"/api/v1/studies/{study}/report", f"/api/v1/studies/{study}/bands",
             f"/api/v1/compare?baseline={study}&candidate={study}", "/api/v1/runs/1/metrics/loss")
    for path in paths * gate.per_user:
        r = client.get(path)
        assert r.status_code != 429, (path, r.text)
    assert counted_when_sent == [0] * len(paths) * gate.per_user
