"""Arms with real runs: a live server, a real worker agent, real PyTorch training on the CPU; the arms
differ by a workload parameter and a config file, and the report names the difference. (The config
file's delivery into the run's directory is tested in tests/worker/test_arm_config_file.py: the agent
removes a run's directory when the run ends.)

The parameter the arms differ by spells out the workload's default (``hidden: 64``) and the workload
reads no config file: both arms train the same model, so each seed's runs are bitwise identical
across the arms and the verdict is known in advance. Arms that really differ (another learning
rate) would leave it to chance which of the three verdicts two seeds give."""

from __future__ import annotations

import pytest

from steady.server.reports.models import Report
from steady.server.cli.render import render_report
from tests.reports.test_report_e2e import _wait_done
from tests.worker.test_worker_agent_e2e import Worker

pytestmark = pytest.mark.slow


def test_arms_with_real_runs(live_server, tmp_path):
    worker = Worker(live_server, tmp_path, "arms-worker")
    try:
        with live_server.client() as http:
            r = http.post("/api/v1/studies", json={
                "name": "lr arms", "workload": {"framework": "torch", "name": "torch_mlp", "params": {"epochs": 1}},
                "seeds": [0, 1], "determinism": ["seeded"], "metrics": [{"name": "loss", "margin": 0.5}],
                "arms": [{"name": "old", "params": {"lr": 1e-3}},
                         {"name": "new", "params": {"lr": 1e-3, "hidden": 64},
                          "config": {"name": "arm.yaml", "content": "hidden: 64\n"}}],
            })
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            _wait_done(http, [sid], timeout=900)  # under xdist, other tests train on the same cores
            report = http.get(f"/api/v1/studies/{sid}/report").json()
            (v,) = [v for v in report["verdicts"] if v["level"] == "stack_portability"]
            assert v["n_runs"] == 4 and v["group"]["differ_by"][0] == "params.hidden (unset vs 64)", v["group"]
            # the same training in both arms: each seed's two runs are bitwise identical, the means equal
            runs = http.get(f"/api/v1/studies/{sid}/runs").json()["items"]
            seen = [(r["id"], r["stack"], r["seed"], r.get("worker_id"), r.get("final_metrics"),
                     r.get("metric_conflicts")) for r in runs]  # what tells kernels from a missing point
            assert v["same_seed"]["n_pairs"] == 2 and v["same_seed"]["verdict"] == "identical", (v["same_seed"], seen)
            assert v["result"]["diff"] == 0.0 and v["diverged_run_ids"] == []
            # Δmean exactly 0 lies inside ±margin: never not_equivalent; and the two seeds' spread is far
            # below what TOST at n = 2 per arm needs (sd < margin / t_0.95,2 ≈ 0.17), so: equivalent
            assert v["verdict"] == "equivalent", v["reason"]
            assert "arms differ by: params.hidden (unset vs 64); config (none vs arm.yaml" in render_report(Report.model_validate(report))
            assert sorted(r["stack"] for r in runs) == ["new", "new", "old", "old"]
            assert {r["status"] for r in runs} == {"completed"}
    finally:
        worker.stop()
