"""Deliveries pending when the server is SIGKILLed are delivered after it restarts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.alerts.conftest import external_study, valid_signature
from tests.conftest import REPO, wait_until


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_pending_deliveries_survive_sigkill(live_server_factory, receiver):
    receiver.down = True
    server = live_server_factory(allow_private_webhooks="true", alert_dispatch_interval_seconds=0.2,
                                 alert_backoff_base_seconds=0.3, alert_backoff_max_seconds=1,
                                 alert_delivery_lease_seconds=3)
    with server.client("admin") as admin:
        hook = admin.post("/api/v1/webhooks", json={"url": receiver.url}).json()
    with server.client() as api:
        sid = external_study(api.post, finals=[0.2, 0.9, 0.4, 1.3, 0.1, 0.7],
                             alerts=[{"kind": "band_width", "metric": "loss", "max": 0.1}])
        (alert,) = api.post(f"/api/v1/studies/{sid}/evaluate").json()["firing"]

        def retried() -> dict | None:
            (d,) = api.get(f"/api/v1/alerts/{alert['id']}/deliveries").json()["items"]
            return d if d["attempts"] >= 2 else None

        delivery = wait_until(retried, 20, interval=0.1, what="two failed delivery attempts")
        assert delivery["status"] == "pending" and "503" in delivery["last_error"]
    server.kill()  # SIGKILL to the server's process group, and waited for
    # Nothing is left that could deliver while the server is down: its process group is gone.
    wait_until(lambda: not _group_alive(server.proc.pid), 10, interval=0.05, what="the server's process group to end")
    receiver.down = False
    assert receiver.received == []
    server.start()
    (msg,) = receiver.wait_for(1, timeout=30)
    assert valid_signature(msg, hook["secret"]) and msg["json"]["alert"]["id"] == alert["id"]
    with server.client() as api:
        (delivery,) = api.get(f"/api/v1/alerts/{alert['id']}/deliveries").json()["items"]
        assert delivery["status"] == "delivered"
    # Delivered is final: no dispatcher claims the delivery again, and the one that delivered it
    # had its answer before it recorded it, so a second POST cannot still be on its way.
    assert len(receiver.received) == 1

    # the CLI lists it, and acknowledges it
    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "steady.server.cli", "alerts", "--server", server.url,
                               "--token", server.tokens["user"], *argv], cwd=REPO, env=server.env,
                              capture_output=True, text=True, timeout=60)

    listed = cli("--state", "firing", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [a["id"] for a in json.loads(listed.stdout)] == [alert["id"]]
    assert cli("--fail-on-firing").returncode == 1
    ack = subprocess.run([sys.executable, "-m", "steady.server.cli", "alerts", "--server", server.url, "--token",
                          server.tokens["user"], "ack", str(alert["id"])], cwd=REPO, env=server.env,
                         capture_output=True, text=True, timeout=60)
    assert ack.returncode == 0 and "acknowledged" in ack.stdout
