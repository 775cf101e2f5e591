"""The verdicts of real runs: a live server, a real worker agent, real PyTorch training on the CPU."""

from __future__ import annotations

import pytest

from tests.conftest import wait_until
from tests.worker.test_worker_agent_e2e import Worker

pytestmark = pytest.mark.slow


def _wait_done(http, study_ids: list[int], timeout: float) -> None:
    def states() -> list[str] | None:
        found = [http.get(f"/api/v1/studies/{sid}").json()["status"] for sid in study_ids]
        return found if all(s in {"completed", "failed", "cancelled"} for s in found) else None

    assert wait_until(states, timeout, interval=0.5, what="the studies to finish") == ["completed"] * len(study_ids)


def _verdict(report: dict, level: str, determinism: str, metric: str = "loss") -> dict:
    (v,) = [v for v in report["verdicts"]
            if v["level"] == level and v["metric"] == metric and v["group"].get("determinism") == determinism]
    return v


def test_real_runs_get_the_right_verdicts(live_server, tmp_path):
    """A seed band over five real PyTorch runs, through the API. The repeatability verdicts of real runs
    (none vs strict on the MLP: seeding, identical; the kernel workload at seeded: numerics) are the demo's
    own checks in tests/test_demo.py, which runs those studies through the same server and worker."""
    worker = Worker(live_server, tmp_path, "cpu-worker")
    try:
        with live_server.client() as http:
            mlp = http.post("/api/v1/studies", json={
                "name": "mlp", "workload": {"framework": "torch", "name": "torch_mlp", "params": {"epochs": 1}},
                "seeds": [0, 1, 2, 3, 4], "repeats": 1, "determinism": ["strict"],
                "metrics": [{"name": "loss", "max_std": 1.0}],
            }).json()["id"]
            _wait_done(http, [mlp], timeout=900)  # under xdist, other tests train on the same cores

            report = http.get(f"/api/v1/studies/{mlp}/report").json()
            band = _verdict(report, "seed_stability", "strict")
            assert band["n_runs"] == 5 and band["verdict"] == "stable", band["reason"]
            bands = http.get(f"/api/v1/studies/{mlp}/bands", params={"metric": "loss"}).json()
            (group,) = bands["groups"]
            assert min(group["n"]) == 5
            assert all(lo <= m <= hi for lo, m, hi in zip(group["ti_low"], group["mean"], group["ti_high"]))
            assert all(lo <= m <= hi for lo, m, hi in zip(group["min"], group["mean"], group["max"]))
    finally:
        worker.stop()
