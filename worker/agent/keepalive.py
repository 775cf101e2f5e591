"""Kept-alive HTTP/1.1 connections for the agent's POSTs, with the standard library's ``http.client``.

A metric batch is the agent's most frequent request and its largest; sent through httpx, the request
and response machinery (URL merging, cookies, httpcore's pool, h11's state machine) cost three times
what the standard library's client costs for the same exchange, on the GPU node that trains. So the
agent's client (``steady.worker.agent.client.SteadyClient``) sends its JSON POSTs here when it can, and
through httpx otherwise: when a test or a caller gave it a transport of its own, or when the
environment names a proxy (httpx honours ``HTTP_PROXY``, ``HTTPS_PROXY`` and ``ALL_PROXY``; this module
does not, so it steps aside). HTTPS uses the SSL context httpx would build (certifi's roots, or
``SSL_CERT_FILE`` / ``SSL_CERT_DIR``).

What goes on the wire is the same request: method, path, ``Host``, the client's headers, a
``Content-Length`` body (headers and body in one write). A connection is kept for the next request
unless the server closes it; one that the server closed while idle is replaced before use, and one
that failed is never reused. The errors are those of the socket and ``http.client``; the caller maps
them (``ERRORS``).
"""

from __future__ import annotations

import http.client
import os
import select
import ssl
import threading

import httpx

# Errors of an exchange on a connection (refused, reset, timed out, a malformed or missing answer).
ERRORS: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")


def environment_names_a_proxy() -> bool:
    """Whether httpx would look for a proxy here (a proxy variable is set, in either case)."""
    return any(os.environ.get(name) or os.environ.get(name.upper()) for name in _PROXY_VARIABLES)


class KeptAlive:
    """Idle connections to one server, taken by one exchange at a time (threads may share it)."""

    def __init__(self, base_url: str, headers: dict[str, str]) -> None:
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.https = url.scheme == "https"
        self.host = url.host
        self.port = url.port or (443 if self.https else 80)
        self.prefix = url.raw_path.decode("ascii").rstrip("/")
        self.context: ssl.SSLContext | None = httpx.create_ssl_context() if self.https else None
        host = f"[{self.host}]" if ":" in self.host else self.host
        netloc = host if url.port is None else f"{host}:{url.port}"
        self.headers = {"Host": netloc, "Accept": "*/*", "Connection": "keep-alive", **headers}
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def post(self, path: str, body: bytes, content_type: str, timeout: float) -> tuple[int, list[tuple[str, str]], bytes]:
        """POST ``body`` to ``path`` (under the base URL's path): the answer's status, headers and body."""
        conn = self._take(timeout)
        try:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            conn.request("POST", self.prefix + path, body=body,
                         headers={**self.headers, "Content-Type": content_type, "Content-Length": str(len(body))})
            response = conn.getresponse()
            content = response.read()
            answer = response.status, response.getheaders(), content
        except BaseException:
            conn.close()
            raise
        self._give_back(conn)
        return answer

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self, timeout: float) -> http.client.HTTPConnection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._new(timeout)
            if conn.sock is not None and not _dropped(conn.sock):
                return conn
            conn.close()  # the server closed it while it was idle (or sent what no request asked for)

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        if conn.sock is None:  # the answer said the connection closes
            return
        with self._lock:
            if not self._closed:
                self._idle.append(conn)
                return
        conn.close()

    def _new(self, timeout: float) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.context)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


def _dropped(sock) -> bool:
    """An idle connection with something to read has been closed by the server (or is out of step)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
