"""A run over the server's per-run key limit is stopped and failed with the server's reason,
not left retrying or completed with missing series (issue #13)."""

from __future__ import annotations

import pytest

from tests.conftest import wait_until
from tests.worker.test_worker_agent_e2e import runs, study_status, submit, workers  # noqa: F401

pytestmark = pytest.mark.slow


def test_run_over_the_key_limit_fails_naming_the_setting(live_server_factory, workers):  # noqa: F811
    server = live_server_factory(max_keys_per_run=1, lease_seconds=5, heartbeat_seconds=1, reaper_interval_seconds=1)
    http = server.client()
    study = submit(http, name="too many keys", workload={"framework": "torch", "name": "torch_mlp", "params": {"epochs": 1}},
                   seeds=[0], repeats=1, determinism=["seeded"], threads=1)
    w = workers(server, "w1")
    wait_until(lambda: study_status(http, study) == "failed", 120, what=f"the run failing\n{w.log()}")
    (run,) = runs(http, study)
    assert run["attempt"] == 1 and run["failure_kind"] == "error"
    assert "STEADY_MAX_KEYS_PER_RUN" in run["error"], run["error"]
