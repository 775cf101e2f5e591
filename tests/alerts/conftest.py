"""A real webhook receiver on loopback, and helpers to build external studies fast."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest


class Receiver:
    """Records every POST; answers 503 while ``down``, and 500 to the next ``fail_next`` requests."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.attempts = 0
        self.fail_next = 0
        self.down = False
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # notified on every POST
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    receiver.attempts += 1
                    if receiver.down:
                        code = 503
                    elif receiver.fail_next > 0:
                        receiver.fail_next -= 1
                        code = 500
                    else:
                        code = 200
                        receiver.received.append({"headers": dict(self.headers), "raw": raw,
                                                  "json": json.loads(raw)})
                    receiver._arrived.notify_all()
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait_for(self, n: int, timeout: float = 20.0) -> list[dict]:
        """The deliveries received, once there are at least ``n`` (woken by each POST, not polled)."""
        with self._arrived:
            if self._arrived.wait_for(lambda: len(self.received) >= n, timeout):
                return list(self.received)
        raise AssertionError(f"receiver got {len(self.received)} of {n} deliveries in {timeout}s "
                             f"({self.attempts} attempts)")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def valid_signature(message: dict, secret: str) -> bool:
    expected = "sha256=" + hmac.new(secret.encode(), message["raw"], hashlib.sha256).hexdigest()
    return hmac.compare_digest(message["headers"].get("X-Steady-Signature", ""), expected)


@pytest.fixture
def fast_alerts(monkeypatch):
    """Dispatcher settings for tests: tick often, retry soon."""
    for key, value in {"DISPATCH_INTERVAL_SECONDS": "0.1", "BACKOFF_BASE_SECONDS": "0.1",
                       "BACKOFF_MAX_SECONDS": "0.5", "DELIVERY_TIMEOUT_SECONDS": "5"}.items():
        monkeypatch.setenv(f"STEADY_ALERT_{key}", value)


def external_study(post, *, name="nightly", suite=None, finals, alerts=(), metrics=("loss",), stack="a100",
                   steps=10, determinism="seeded", nan_at=None) -> int:
    """An external study with one uploaded run per final value (curves decay to the final value)."""
    body = {"name": name, "kind": "external", "metrics": list(metrics), "alerts": list(alerts)}
    if suite:
        body["suite"] = suite
    r = post("/api/v1/studies", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    for seed, final in enumerate(finals):
        curve = (final + np.exp(-np.arange(steps) / 3.0)).tolist()
        curve[-1] = float(final)
        if nan_at is not None and seed == 0:
            curve[nan_at] = "NaN"
        run = {"seed": seed, "determinism": determinism, "stack": {"name": stack},
               "metrics": {m: {"steps": list(range(steps)), "values": curve} for m in metrics}}
        r = post(f"/api/v1/studies/{sid}/runs", json=run)
        assert r.status_code == 201, r.text
    return sid
