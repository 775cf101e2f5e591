"""The worker client: one request id per call, reused by its retries; 409 codes mapped to types."""

from __future__ import annotations

import json

import httpx
import pytest

from steady.worker.agent.client import AlreadyFinishedError, LeaseLostError, SteadyClient
from steady.worker.contract.protocol import RunResult


def _client(handler) -> SteadyClient:
    return SteadyClient("http://steady.test", "t", transport=httpx.MockTransport(handler),
                        retry_deadline_s=5, backoff_base_s=0.0, backoff_max_s=0.0)


def test_retries_of_one_call_share_its_request_id_and_calls_differ():
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content)["request_id"])
        if len(seen) % 3:  # the first two tries of each call fail in transit
            raise httpx.ReadError("connection reset")
        return httpx.Response(200, json={"run_id": 1, "status": "completed"})

    with _client(handler) as client:
        client.complete(1, RunResult(lease_id="l"))
        client.complete(1, RunResult(lease_id="l"))
    assert len(seen) == 6 and len(set(seen[:3])) == 1 and len(set(seen[3:])) == 1 and seen[0] != seen[3]


def test_lease_retries_share_a_request_id():
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content)["request_id"])
        return httpx.Response(503) if len(seen) < 3 else httpx.Response(204)

    with _client(handler) as client:
        assert client.lease(4) is None
    assert len(seen) == 3 and len(set(seen)) == 1


@pytest.mark.parametrize("legacy", [False, True], ids=["error-shape", "server-before-error-shape"])
@pytest.mark.parametrize(("code", "error"), [("lease_lost", LeaseLostError), ("already_finished", AlreadyFinishedError)])
def test_conflict_codes_map_to_their_errors(code, error, legacy):
    body = {"detail": "no", "code": code} if legacy else {"detail": [{"loc": [], "msg": "no", "type": code}]}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json=body)

    with _client(handler) as client, pytest.raises(error) as raised:
        client.complete(1, RunResult(lease_id="l"))
    assert type(raised.value) is error
