"""The one SSRF guard (``steady.server.alerts.egress``), unit by unit: ports, address ranges, the target the
request goes to. Rule validation and the dispatcher both call it (test_webhook_guard.py)."""

from __future__ import annotations

import pytest

from steady.server.alerts import egress, webhooks
from steady.server.kit.errors import Invalid

PUBLIC = "93.184.216.34"


def fixed(*addresses: str):
    seen = []

    def resolver(host: str, port: int) -> list[str]:
        seen.append((host, port))
        return list(addresses)

    resolver.seen = seen
    return resolver


@pytest.mark.parametrize(("url", "port"), [
    ("http://hooks.example.com/x", 80),
    ("https://hooks.example.com/x", 443),
    ("http://hooks.example.com:8080/x", 8080),
    ("https://hooks.example.com:8443/x", 8443),
])
def test_default_ports_are_80_for_http_and_443_for_https(url, port):
    resolver = fixed(PUBLIC)
    target = egress.resolve(url, allow_private=False, resolver=resolver)
    assert target.port == port and resolver.seen == [("hooks.example.com", port)]
    assert target.request_url() == f"{url.split('://')[0]}://{PUBLIC}:{port}/x"
    assert target.host_header() == ("hooks.example.com" if port in (80, 443) else f"hooks.example.com:{port}")


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.8.9.10", "::1",  # loopback
    "10.1.2.3", "172.16.0.1", "192.168.1.1", "fc00::1", "100.64.0.1",  # private and shared
    "169.254.169.254", "fe80::1",  # link-local (cloud metadata)
    "0.0.0.0", "224.0.0.1", "ff02::1",  # unspecified, multicast
    "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:93.184.216.34", "::ffff:0:7f00:1",  # IPv4-mapped, -translated
])
def test_non_public_and_ipv4_mapped_addresses_are_refused(address, monkeypatch):
    assert egress.non_public_reason(address) is not None
    with pytest.raises(egress.RefusedTarget):
        egress.resolve("https://hooks.example.com/x", allow_private=False, resolver=fixed(address))
    # the same answer from webhook validation, which calls the same guard
    monkeypatch.setattr(egress, "default_resolver", fixed(address))
    with pytest.raises(Invalid):
        webhooks.check_webhook_url("https://hooks.example.com/x", allow_private=False)


@pytest.mark.parametrize("address", [PUBLIC, "2606:4700:4700::1111", "8.8.8.8"])
def test_public_addresses_pass(address):
    assert egress.non_public_reason(address) is None
    assert egress.resolve("https://h.example/x", allow_private=False, resolver=fixed(address)).address == address


def test_private_receivers_are_allowed_when_configured():
    target = egress.resolve("http://receiver.lan/x", allow_private=True, resolver=fixed("::ffff:10.0.0.7"))
    assert target.address == "::ffff:10.0.0.7" and target.request_url() == "http://[::ffff:10.0.0.7]:80/x"


@pytest.mark.parametrize("url", ["ftp://h.example/x", "file:///etc/passwd", "https://user:pw@h.example/x",
                                 "https:///x", "http://h.example:99999/x"])
def test_bad_urls_are_refused_before_any_lookup(url):
    resolver = fixed(PUBLIC)
    with pytest.raises(egress.RefusedTarget):
        egress.resolve(url, allow_private=False, resolver=resolver)
    assert resolver.seen == []
