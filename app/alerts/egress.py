"""The one outbound guard for webhooks: resolve a URL's host once, check every address, and
connect to the address that was checked.

Resolving the name for the check and again for the connection lets a DNS server answer a
public address first and a private one second (DNS rebinding). Here the name is resolved once
per attempt; the request then goes to that IP, with the name in the ``Host`` header and as the
TLS server name (SNI and certificate check), so a receiver behind a name still works.

IPv6 forms that carry an IPv4 address are refused outright, whatever the address inside:
IPv4-mapped (``::ffff:0:0/96``), IPv4-compatible (``::/96``, e.g. ``::127.0.0.1``),
IPv4-translated (``::ffff:0:0:0/96``), NAT64 (``64:ff9b::/96``, ``64:ff9b:1::/48``),
6to4 (``2002::/16``) and Teredo (``2001::/32``); and the deprecated site-local ``fec0::/10``.
A host may route these to an internal IPv4 address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

Resolver = Callable[[str, int], list[str]]

EMBEDS_IPV4 = tuple(
    ipaddress.ip_network(n)
    for n in ("::ffff:0:0/96", "::/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16",
              "2001::/32", "fec0::/10")
)


class RefusedTarget(ValueError):
    """The URL may not be called (scheme, credentials, unresolvable or non-public host)."""


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]).split("%", 1)[0] for info in infos]


# Tests replace this (no real DNS); production uses the system resolver.
default_resolver: Resolver = system_resolver


def non_public_reason(address: str) -> str | None:
    """Why ``address`` is not a public unicast address, or None when it is."""
    addr = ipaddress.ip_address(address)
    if isinstance(addr, ipaddress.IPv6Address):
        for net in EMBEDS_IPV4:
            if addr in net:
                return f"{addr} is in {net}, an IPv6 range that embeds IPv4 addresses or is site-local"
    if addr.is_multicast:
        return f"{addr} is a multicast address"
    if not addr.is_global:
        return f"{addr} is a loopback, link-local, private or reserved address"
    return None


@dataclass(frozen=True)
class Target:
    url: str
    scheme: str
    host: str  # the name in the URL
    port: int
    address: str  # the checked address the request goes to

    def request_url(self) -> str:
        """The URL with the checked address in place of the name."""
        parts = urlsplit(self.url)
        ip = f"[{self.address}]" if ":" in self.address else self.address
        return urlunsplit((parts.scheme, f"{ip}:{self.port}", parts.path or "/", parts.query, ""))

    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == default else f"{name}:{self.port}"

    def extensions(self) -> dict[str, str]:
        return {"sni_hostname": self.host} if self.scheme == "https" else {}


def check_url(url: str) -> tuple[str, str, int]:
    """Scheme, host and port of a webhook URL, or RefusedTarget."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RefusedTarget("a webhook URL must be http:// or https:// with a host")
    if parts.username or parts.password:
        raise RefusedTarget("credentials in the URL are not allowed; sign with the secret instead")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise RefusedTarget(f"bad port: {exc}") from None
    return parts.scheme, parts.hostname, port


def resolve(url: str, *, allow_private: bool, resolver: Resolver | None = None) -> Target:
    """Resolve the URL's host once and check every address; the Target to connect to.

    Every address must be public unless ``allow_private``: a name with one public and one
    private address is refused.
    """
    scheme, host, port = check_url(url)
    try:
        addresses = (resolver or default_resolver)(host, port)
    except (OSError, ValueError, UnicodeError) as exc:
        raise RefusedTarget(f"cannot resolve host {host!r}: {exc}") from None
    if not addresses:
        raise RefusedTarget(f"host {host!r} has no address")
    if not allow_private:
        for address in addresses:
            reason = non_public_reason(address)
            if reason:
                raise RefusedTarget(
                    f"host {host!r} resolves to {reason}; set STEADY_ALLOW_PRIVATE_WEBHOOKS=true to allow "
                    "on-prem receivers"
                )
    return Target(url=url, scheme=scheme, host=host, port=port, address=addresses[0])
