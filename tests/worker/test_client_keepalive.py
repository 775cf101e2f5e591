"""The worker client's POSTs on kept-alive standard-library connections (steady.worker.agent.keepalive):
the request on the wire, connection reuse and replacement, and the answers' mapping, as through httpx."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from steady.worker.agent.client import LeaseLostError, NonRetryableError, RetryableError, SteadyClient
from steady.worker.contract.protocol import Heartbeat, MetricBatch, Series


@dataclass
class Wire:
    """What a plain HTTP/1.1 server saw, and what it answers next (a queue of (status, headers, body))."""

    requests: list[dict] = field(default_factory=list)
    connections: set[int] = field(default_factory=set)
    answers: list[tuple[int, dict[str, str], bytes]] = field(default_factory=list)
    default: tuple[int, dict[str, str], bytes] = (200, {}, b"{}")


@pytest.fixture
def wire() -> Iterator[tuple[str, Wire]]:
    seen = Wire()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive unless an answer says otherwise

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.connections.add(id(self.connection))
            seen.requests.append({"path": self.path, "headers": dict(self.headers.items()), "body": body})
            status, headers, out = seen.answers.pop(0) if seen.answers else seen.default
            self.send_response(status)
            headers = {"Content-Type": "application/json", **headers}
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            if headers.get("Connection") == "close":
                self.close_connection = True

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def _ack(seq: int) -> bytes:
    return json.dumps({"run_id": 7, "seq": seq, "points": 3, "duplicate": False}).encode()


def _batch(seq: int) -> MetricBatch:
    return MetricBatch(lease_id="L", seq=seq, series=[Series.packed("loss", [0, 1, 2], [0.5, float("nan"), 1.0])])


def test_posts_reuse_one_connection_and_carry_the_same_request(wire, monkeypatch):
    url, seen = wire
    seen.answers = [(200, {}, _ack(i)) for i in range(3)]
    with SteadyClient(url + "/", "tok") as client:
        assert client._direct is not None
        acks = [client.send_metrics(7, _batch(i)) for i in range(3)]
    assert [a.seq for a in acks] == [0, 1, 2]
    assert len(seen.connections) == 1
    first = seen.requests[0]
    assert first["path"] == "/api/v1/runs/7/metrics"
    assert first["headers"]["Authorization"] == "Bearer tok"
    assert first["headers"]["User-Agent"] == "steady-worker"
    assert first["headers"]["Content-Type"] == "application/json"
    assert first["headers"]["Host"] == url.removeprefix("http://")
    assert first["body"] == _batch(0).model_dump_json(exclude_none=True).encode()
    # the same exchange through httpx (a proxy named in the environment): the same body and headers
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")  # not for http:// URLs, but httpx decides
    seen.answers = [(200, {}, _ack(0))]
    with SteadyClient(url, "tok") as client:
        assert client._direct is None
        client.send_metrics(7, _batch(0))
    again = seen.requests[-1]
    assert again["body"] == first["body"] and again["path"] == first["path"]
    for name in ("Authorization", "User-Agent", "Content-Type", "Host", "Content-Length"):
        assert again["headers"][name] == first["headers"][name]


def test_a_connection_the_server_closed_is_replaced(wire):
    url, seen = wire
    seen.answers = [(200, {"Connection": "close"}, _ack(0)), (200, {}, _ack(1)), (200, {}, _ack(2))]
    with SteadyClient(url, "tok", retry_deadline_s=0) as client:
        client.send_metrics(7, _batch(0))  # answered with Connection: close
        client.send_metrics(7, _batch(1))  # a new connection
        # the server drops the idle connection: the next request opens another, no error reaches the caller
        idle = client._direct._idle
        assert len(idle) == 1
        idle[0].sock.shutdown(socket.SHUT_RD)  # as if the server had closed it: readable at EOF
        client.send_metrics(7, _batch(2))
    assert len(seen.requests) == 3 and len(seen.connections) >= 2


def test_answers_map_as_through_httpx(wire):
    url, seen = wire
    detail = {"detail": [{"loc": ["body", "seq"], "msg": "too small", "type": "value_error"}]}
    lost = {"detail": [{"loc": [], "msg": "lease lost", "type": "lease_lost"}]}
    seen.answers = [(503, {"Retry-After": "0"}, b"{}"), (200, {}, _ack(0)),
                    (422, {}, json.dumps(detail).encode()), (409, {}, json.dumps(lost).encode())]
    with SteadyClient(url, "tok", backoff_base_s=0.0, backoff_max_s=0.0) as client:
        assert client.send_metrics(7, _batch(0)).seq == 0  # the 503 retried
        with pytest.raises(NonRetryableError) as info:
            client.send_metrics(7, _batch(1))
        assert info.value.status_code == 422 and str(info.value).endswith("HTTP 422: body.seq: too small")
        with pytest.raises(LeaseLostError):
            client.heartbeat(7, Heartbeat(lease_id="L"))
        seen.answers = [(204, {"X-Steady-Pending": "3"}, b"")]
        response = client.post("/api/v1/workers/1/lease", Heartbeat(lease_id="L"))
        assert response.status_code == 204 and response.headers["x-steady-pending"] == "3"
    assert len(seen.requests) == 5


def test_a_server_that_is_gone_is_a_retryable_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    with SteadyClient(f"http://127.0.0.1:{port}", "tok", retry_deadline_s=0) as client, pytest.raises(RetryableError):
        client.send_metrics(7, _batch(0))
