"""Arms with real runs: a live server, a real worker agent, real PyTorch training on the CPU; the arms
differ by a workload parameter and a config file, and the report names the difference. (The config
file's delivery into the run's directory is tested in tests/worker/test_arm_config_file.py: the agent
removes a run's directory when the run ends.)"""

from __future__ import annotations

import pytest

from app.reports.models import Report
from app.reports.render import render_report
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
                         {"name": "new", "params": {"lr": 3e-3}, "config": {"name": "arm.yaml", "content": "lr: 3e-3\n"}}],
            })
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            _wait_done(http, [sid], timeout=300)
            report = http.get(f"/api/v1/studies/{sid}/report").json()
            (v,) = [v for v in report["verdicts"] if v["level"] == "stack_portability"]
            assert v["n_runs"] == 4 and v["verdict"] in {"equivalent", "not_equivalent", "inconclusive"}
            assert v["group"]["differ_by"][0] == "params.lr (0.001 vs 0.003)", v["group"]
            assert "arms differ by: params.lr (0.001 vs 0.003); config (none vs arm.yaml" in render_report(Report.model_validate(report))
            runs = http.get(f"/api/v1/studies/{sid}/runs").json()["items"]
            assert sorted(r["stack"] for r in runs) == ["new", "new", "old", "old"]
            assert {r["status"] for r in runs} == {"completed"}
    finally:
        worker.stop()
