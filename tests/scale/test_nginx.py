"""The shipped nginx configuration (deploy/nginx.conf), run by a real nginx in front of two real
API processes on one database: a dashboard login and a study go through it, over http and https.

One nginx and its two API processes per backend serve both tests (the login tests change nothing the other
reads: each logs in with its own session), so the module starts them once per backend, not once per test."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.api.helpers import spec
from tests.conftest import (REPO, create_pg_database, drop_pg_database, free_port, pg_url_for, start_live_server,
                            wait_until)
from tests.scale.conftest import Server

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
pytestmark = [pytest.mark.skipif(NGINX is None, reason="nginx is not installed (make system-deps installs it)"),
              pytest.mark.xdist_group("nginx")]  # one xdist worker: both tests use the module's nginx


def _config(tmp: Path, backends: list[str], http_port: int, https_port: int | None) -> Path:
    """deploy/nginx.conf with its upstream and listen lines pointed at loopback; temp paths in ``tmp``;
    with a TLS listener (the same location block) when ``https_port`` is given."""
    conf = (REPO / "deploy" / "nginx.conf").read_text()
    servers = "\n".join(f"        server {b.removeprefix('http://')} max_fails=3 fail_timeout=5s;" for b in backends)
    conf, n = re.subn(r"^\s*server api:8000[^\n]*;$", servers, conf, flags=re.MULTILINE)
    assert n == 1, "the shipped config's upstream line changed; update this test"
    conf, n = re.subn(r"listen 8080;", f"listen 127.0.0.1:{http_port};", conf)
    assert n == 1
    temp = "\n".join(f"    {d}_temp_path {tmp / d};" for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    conf = conf.replace("http {", f"http {{\n    access_log {tmp / 'access.log'};\n{temp}", 1)
    if https_port is not None:
        location = re.search(r"(\s*location / \{.*?\n\s*\})", conf, flags=re.DOTALL).group(1)
        tls = (f"\n    server {{\n        listen 127.0.0.1:{https_port} ssl;\n"
               f"        ssl_certificate {tmp / 'cert.pem'};\n        ssl_certificate_key {tmp / 'key.pem'};"
               f"{location}\n    }}\n")
        conf = conf.rstrip().removesuffix("}") + tls + "}\n"
    path = tmp / "nginx.conf"
    path.write_text(conf)
    return path


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request, tmp_path_factory, sqlite_template):
    """Two API processes on one database of the backend: (root folder, [a, b])."""
    root = tmp_path_factory.mktemp(f"nginx-{request.param}")
    pg_name = None
    if request.param == "sqlite":
        url = f"sqlite:///{root / 'shared' / 'steady.db'}"
    else:
        pg_name = create_pg_database(template=request.getfixturevalue("pg_template"))
        url = pg_url_for(pg_name)
    servers: list[Server] = []
    try:
        for i in range(2):
            servers.append(start_live_server(root / f"api{i}", url, sqlite_template=sqlite_template, cls=Server,
                                             tokens=servers[0].tokens if servers else None))
        yield root, servers
    finally:
        for s in servers:
            s.stop()
        if pg_name is not None:
            drop_pg_database(pg_name)


@pytest.fixture(scope="module")
def proxy(backend):
    root, (a, b) = backend
    tmp = root / "nginx"
    tmp.mkdir()
    https_port = None
    if shutil.which("openssl"):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=127.0.0.1", "-keyout", str(tmp / "key.pem"), "-out", str(tmp / "cert.pem")],
                       check=True, capture_output=True)
        https_port = free_port()
    http_port = free_port()
    conf = _config(tmp, [a.url, b.url], http_port, https_port)
    log = open(tmp / "nginx.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(conf), "-g",
                             f"daemon off; pid {tmp / 'nginx.pid'}; error_log {tmp / 'error.log'};"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{http_port}"

    def up() -> bool:
        assert proc.poll() is None, (tmp / "nginx.log").read_text() + (tmp / "error.log").read_text()
        try:
            return httpx.get(url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 30, what="nginx in front of the API")
    yield {"http": url, "https": f"https://127.0.0.1:{https_port}" if https_port else None, "servers": (a, b)}
    proc.send_signal(signal.SIGQUIT)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _login(base: str, token: str, **kw) -> httpx.Response:
    # a browser posting the login form sends the page's own origin
    return httpx.post(base + "/login", data={"token": token, "next": "/studies"}, headers={"Origin": base},
                      follow_redirects=False, **kw)


def test_login_and_a_study_through_the_shipped_nginx(proxy):
    base, (a, b) = proxy["http"], proxy["servers"]
    r = _login(base, a.tokens["user"])
    assert r.status_code == 303, r.text  # before: 403, nginx's `Host $host` dropped the port
    assert r.headers["location"] == "/studies"
    cookie = r.headers["set-cookie"]
    assert "secure" not in cookie.lower()  # plain http
    sid = r.cookies["steady_session"]
    assert sid != a.tokens["user"]
    # a client cannot claim https through the proxy: nginx overwrites X-Forwarded-Proto
    spoofed = httpx.post(base + "/login", data={"token": a.tokens["user"]}, follow_redirects=False,
                         headers={"Origin": base, "X-Forwarded-Proto": "https"})
    assert spoofed.status_code == 303 and "secure" not in spoofed.headers["set-cookie"].lower()
    # another origin is still refused
    assert httpx.post(base + "/login", data={"token": a.tokens["user"]}, follow_redirects=False,
                      headers={"Origin": "http://evil.example"}).status_code == 403

    with httpx.Client(base_url=base, cookies={"steady_session": sid}) as browser:
        page = browser.get("/studies")
        assert page.status_code == 200 and "Signed in as" in page.text
    created = httpx.post(base + "/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["seeded"]),
                         headers=a.headers("user"))
    assert created.status_code == 201, created.text
    study_id = created.json()["id"]
    # both API processes behind the proxy see the study and the session (nothing is kept in a process)
    for server in (a, b):
        assert httpx.get(f"{server.url}/api/v1/studies/{study_id}", headers=server.headers("user")).status_code == 200
        assert httpx.get(f"{server.url}/api/v1/studies", cookies={"steady_session": sid}).status_code == 200
    with httpx.Client(base_url=base, cookies={"steady_session": sid}) as browser:
        for _ in range(4):  # spread over both upstreams
            assert browser.get(f"/studies/{study_id}").status_code == 200
        assert browser.post("/logout", headers={"Origin": base}, follow_redirects=False).status_code == 303
    assert httpx.get(base + "/api/v1/studies", cookies={"steady_session": sid}).status_code == 401


def test_login_over_https_gets_a_secure_cookie(proxy):
    if proxy["https"] is None:
        pytest.skip("openssl is not installed: no certificate for the TLS listener")
    base, (a, _) = proxy["https"], proxy["servers"]
    r = _login(base, a.tokens["user"], verify=False)
    assert r.status_code == 303, r.text
    assert "secure" in r.headers["set-cookie"].lower()
