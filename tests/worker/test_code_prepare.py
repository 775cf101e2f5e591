"""A run's code is fetched and unpacked under its lease: heartbeats go on meanwhile, so a slow
download or a large archive never costs the lease (the agent against the shared server, whose
leases last 5 s with a heartbeat every second): a slow download, and a slow unpacking after which
the run completes."""

from __future__ import annotations

import threading

import httpx
import pytest

from steady.worker.agent.client import NonRetryableError, SteadyClient
from steady.worker.agent.loop import Agent, AgentConfig
from steady.worker.contract import codepack
from tests.api.helpers import spec


class SlowDownload(SteadyClient):
    """The worker's real client, whose code download lasts until the lease was renewed twice
    (a slow network, or a large archive): then it gives up, so the run stops there, cheaply."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.renewed = threading.Event()
        self.acks = 0
        self.renewed_while_fetching: bool | None = None

    def heartbeat(self, run_id, heartbeat, **kwargs):
        ack = super().heartbeat(run_id, heartbeat, **kwargs)  # LeaseLostError if the lease was lost
        self.acks += 1
        if self.acks >= 2:
            self.renewed.set()
        return ack

    def fetch_code(self, sha256, **kwargs):
        self.renewed_while_fetching = self.renewed.wait(30)
        raise NonRetryableError("the download gave up (test)", 404)


class SlowUnpack(SlowDownload):
    """The download is quick; unpacking lasts until the lease was renewed twice (an archive of many
    files: 2 M of them once took 134 s with no heartbeat), then the run goes on and completes."""

    def fetch_code(self, sha256, **kwargs):
        return SteadyClient.fetch_code(self, sha256, **kwargs)


@pytest.mark.parametrize("slow", ["download", "unpack"])
def test_heartbeats_keep_the_lease_while_the_code_is_prepared(live_server, tmp_path, monkeypatch, slow):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("def main(ctx):\n    ctx.log(step=0, loss=1.0)\n")
    packed = codepack.pack(str(tmp_path / "src"))
    with httpx.Client(base_url=live_server.url, headers=live_server.headers("user"), timeout=30) as c:
        assert c.put(f"/api/v1/code/{packed.sha256}", content=packed.data).status_code == 200
        study = c.post("/api/v1/studies", json=spec(
            workload={"framework": "python", "entrypoint": "train.py:main"}, seeds=[0], repeats=1,
            determinism=["seeded"], max_attempts=1, code={"sha256": packed.sha256, "workdir": "."}))
        assert study.status_code == 201, study.text
        sid = study.json()["id"]
    client = (SlowDownload if slow == "download" else SlowUnpack)(live_server.url, live_server.tokens["worker"])
    if slow == "unpack":
        from steady.worker.agent import codecache

        real_extract = codecache.codepack.extract

        def slow_extract(*args, **kwargs):
            client.renewed_while_fetching = client.renewed.wait(30)
            return real_extract(*args, **kwargs)

        monkeypatch.setattr(codecache.codepack, "extract", slow_extract)
    agent = Agent(AgentConfig(server=live_server.url, token=live_server.tokens["worker"], work_dir=str(tmp_path / "w"),
                              study_id=sid, max_runs=1, poll_min_s=0.05, poll_max_s=0.2), client=client)
    assert agent.run() == 0
    assert client.renewed_while_fetching is True  # two heartbeats acknowledged while the code was prepared
    with httpx.Client(base_url=live_server.url, headers=live_server.headers("user"), timeout=30) as c:
        (run,) = c.get(f"/api/v1/studies/{sid}/runs").json()["items"]
    if slow == "download":
        assert run["status"] == "failed" and "the download gave up (test)" in run["error"], run  # under its lease
    else:
        assert run["status"] == "completed" and run["attempt"] == 1, run  # the lease held through the unpacking
