"""Webhook hardening: secret shown once, one SSRF guard (DNS rebinding, IPv6 forms embedding IPv4),
Slack escaping, per-webhook rate limit. No real DNS: resolvers are injected."""

from __future__ import annotations

import json

import httpx
import pytest

from steady.server.alerts import egress
from steady.server.alerts.dispatcher import Dispatcher, TokenBucket
from steady.server.alerts.settings import AlertSettings
from steady.server.models import AlertDelivery
from tests.alerts.conftest import external_study
from tests.conftest import SQLITE_ONLY

pytestmark = SQLITE_ONLY  # the guard judges URLs; its SQL is plain ORM: a PostgreSQL pass would repeat the SQLite one

WIDE = [0.2, 0.9, 0.4, 1.3, 0.1, 0.7, 1.1, 0.5]
BAND_RULE = {"kind": "band_width", "metric": "loss", "max": 0.1, "severity": "critical"}
PUBLIC = "93.184.216.34"


@pytest.fixture
def quiet_api(make_api, monkeypatch):
    """An app whose own dispatcher stays idle: the test drives a Dispatcher by hand."""
    monkeypatch.setenv("STEADY_ALERT_DISPATCH_INTERVAL_SECONDS", "3600")
    return make_api


def _fire(api, hook_url: str, *, name: str = "nightly") -> tuple[dict, int]:
    hook = api.post("/api/v1/webhooks", role="admin", json={"url": hook_url, "name": "h"})
    assert hook.status_code == 201, hook.text
    sid = external_study(api.post, name=name, finals=WIDE, alerts=[BAND_RULE])
    r = api.post(f"/api/v1/studies/{sid}/evaluate")
    assert r.status_code == 200 and len(r.json()["firing"]) == 1, r.text
    return hook.json(), sid


def test_webhook_secret_is_shown_only_at_creation(api, monkeypatch):
    monkeypatch.setattr(egress, "default_resolver", lambda host, port: [PUBLIC])
    created = api.post("/api/v1/webhooks", role="admin", json={"url": "https://hooks.example.com/x", "name": "h"})
    assert created.status_code == 201 and created.json()["secret"].startswith("whsec_")
    listed = api.get("/api/v1/webhooks", role="admin")
    assert listed.status_code == 200 and listed.json()["total"] == 1
    assert all("secret" not in h for h in listed.json()["items"])
    assert created.json()["secret"] not in listed.text


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.0.0.5", "169.254.169.254", "::1", "fe80::1",
    "::127.0.0.1", "::ffff:127.0.0.1", "::ffff:0:7f00:1", "64:ff9b::7f00:1", "64:ff9b:1::a00:1",
    "2002:7f00:1::1", "2002:5db8:d822::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "fec0::1",
])
def test_non_public_and_ipv4_embedding_addresses_are_refused(api, monkeypatch, address):
    monkeypatch.setattr(egress, "default_resolver", lambda host, port: [address])
    r = api.post("/api/v1/webhooks", role="admin", json={"url": "https://hooks.example.com/x", "name": "h"})
    assert r.status_code == 422, (address, r.text)
    assert r.json()["detail"][0]["loc"] == ["body", "url"]


@pytest.mark.parametrize("addresses", [[PUBLIC], ["2606:4700:4700::1111"]])
def test_public_addresses_are_accepted(api, monkeypatch, addresses):
    monkeypatch.setattr(egress, "default_resolver", lambda host, port: addresses)
    r = api.post("/api/v1/webhooks", role="admin", json={"url": "https://hooks.example.com/x", "name": "h"})
    assert r.status_code == 201, r.text


def test_one_private_address_among_public_ones_is_refused(api, monkeypatch):
    monkeypatch.setattr(egress, "default_resolver", lambda host, port: [PUBLIC, "::127.0.0.1"])
    r = api.post("/api/v1/webhooks", role="admin", json={"url": "https://hooks.example.com/x", "name": "h"})
    assert r.status_code == 422


def test_there_is_one_ssrf_check():
    # Rule validation (webhooks.check_webhook_url) and the dispatcher both call egress.resolve;
    # no other module of the app resolves names or judges addresses.
    from pathlib import Path

    import steady.server

    root = Path(steady.server.__file__).parent
    for path in root.rglob("*.py"):
        if path == root / "alerts" / "egress.py":
            continue
        src = path.read_text()
        assert "getaddrinfo" not in src and "is_private" not in src and "is_global" not in src, path


class Rebinder:
    """A DNS server that answers a public address, then loopback (the rebinding attack)."""

    def __init__(self, first: str, then: str) -> None:
        self.first, self.then, self.calls = first, then, 0

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls += 1
        return [self.first if self.calls % 2 == 1 else self.then]


def test_dns_rebinding_connects_to_the_checked_address(quiet_api, monkeypatch):
    """The check sees a public address; a second lookup would see loopback. The request must go to
    the checked public address with the name as Host and TLS server name, and the name is looked up once."""
    monkeypatch.setattr(egress, "default_resolver", lambda host, port: [PUBLIC])
    api = quiet_api()
    _fire(api, "https://hooks.example.com/in")
    seen: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda request: seen.append(request) or httpx.Response(200))
    rebinder = Rebinder(PUBLIC, "127.0.0.1")
    d = Dispatcher(api.app.state.database, api.app.state.settings, AlertSettings(), resolver=rebinder,
                   transport=transport)
    assert d.deliver_due() == 1
    (req,) = seen
    assert req.url.host == PUBLIC and req.url.scheme == "https" and req.url.port in (None, 443)
    assert req.headers["Host"] == "hooks.example.com"
    assert req.extensions["sni_hostname"] == "hooks.example.com"
    assert rebinder.calls == 1


def test_dns_rebinding_to_loopback_at_send_time_is_refused(quiet_api, monkeypatch):
    monkeypatch.setattr(egress, "default_resolver", lambda host, port: [PUBLIC])
    api = quiet_api()
    _fire(api, "http://hooks.example.com/in")
    seen: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda request: seen.append(request) or httpx.Response(200))
    d = Dispatcher(api.app.state.database, api.app.state.settings, AlertSettings(),
                   resolver=lambda host, port: ["::ffff:127.0.0.1"], transport=transport)
    assert d.deliver_due() == 0 and seen == []
    with api.app.state.database.read() as s:
        (row,) = s.query(AlertDelivery).all()
        assert row.status == "pending" and "refused" in row.last_error


def test_real_connection_goes_to_the_checked_address(quiet_api, receiver):
    """Over a real socket: the name resolves to the receiver once, then to an unroutable address;
    the delivery still reaches the receiver, with the name in the Host header."""
    api = quiet_api(allow_private_webhooks=True)
    port = receiver.server.server_address[1]
    rebinder = Rebinder("127.0.0.1", "10.255.255.1")
    import steady.server.alerts.egress as eg

    eg_default = eg.default_resolver
    eg.default_resolver = lambda host, p: ["127.0.0.1"]
    try:
        _fire(api, f"http://rebind.example.test:{port}/hook")
    finally:
        eg.default_resolver = eg_default
    d = Dispatcher(api.app.state.database, api.app.state.settings, AlertSettings(delivery_timeout_seconds=3),
                   resolver=rebinder)
    try:
        assert d.deliver_due() == 1
    finally:
        d._http.close()
    (msg,) = receiver.wait_for(1)
    assert msg["headers"]["Host"] == f"rebind.example.test:{port}"


def test_slack_control_sequences_are_escaped(quiet_api, monkeypatch):
    monkeypatch.setattr(egress, "default_resolver", lambda host, port: [PUBLIC])
    api = quiet_api()
    _fire(api, "https://hooks.slack.example.com/services/x", name="<!channel> <https://evil.example|click> & co")
    with api.app.state.database.read() as s:
        (row,) = s.query(AlertDelivery).all()
        body = json.loads(row.body)
    from steady.server.alerts.outbox import slack_escape

    assert slack_escape("<!channel> & <@U1>") == "&lt;!channel&gt; &amp; &lt;@U1&gt;"
    assert "<" not in body["text"] and ">" not in body["text"]
    assert "<!channel>" not in body["text"] and "<https://evil" not in body["text"]


def test_token_bucket_with_an_injected_clock():
    now = [0.0]
    bucket = TokenBucket(rate=1.0, burst=2, clock=lambda: now[0])
    assert bucket.take(1) == 0.0 and bucket.take(1) == 0.0
    assert bucket.take(1) == pytest.approx(1.0)  # empty: wait a second
    assert bucket.take(2) == 0.0  # per webhook
    now[0] = 0.5
    assert bucket.take(1) == pytest.approx(0.5)
    now[0] = 1.0
    assert bucket.take(1) == 0.0


def test_deliveries_over_the_rate_wait_and_are_not_dropped(quiet_api, monkeypatch):
    monkeypatch.setattr(egress, "default_resolver", lambda host, port: [PUBLIC])
    api = quiet_api()
    _fire(api, "https://hooks.example.com/in", name="study-0")
    for sid in [external_study(api.post, name=f"study-{i}", finals=WIDE, alerts=[BAND_RULE]) for i in range(1, 4)]:
        r = api.post(f"/api/v1/studies/{sid}/evaluate")
        assert r.status_code == 200 and len(r.json()["firing"]) == 1, r.text
    with api.app.state.database.read() as s:
        assert s.query(AlertDelivery).count() == 4
    seen: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda request: seen.append(request) or httpx.Response(200))
    now = [0.0]
    cfg = AlertSettings(webhook_rate_per_minute=60, webhook_burst=2)
    d = Dispatcher(api.app.state.database, api.app.state.settings, cfg, resolver=lambda h, p: [PUBLIC],
                   transport=transport, clock=lambda: now[0])
    assert d.deliver_due() == 2 and len(seen) == 2  # the burst; the other two wait
    with api.app.state.database.write() as s:
        waiting = [r for r in s.query(AlertDelivery) if r.status == "pending"]
        assert len(waiting) == 2 and all(r.attempts == 0 for r in waiting)
        for r in waiting:  # make them due again now (the test does not wait for the wall clock)
            r.next_attempt_at = r.created_at
    assert d.deliver_due() == 0  # the injected clock has not moved: still no token
    now[0] = 2.0
    with api.app.state.database.write() as s:
        for r in s.query(AlertDelivery):
            r.next_attempt_at = r.created_at
    assert d.deliver_due() == 2 and len(seen) == 4
