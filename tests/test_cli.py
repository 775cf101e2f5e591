"""The CLI as a user drives it, against a real server process."""

from __future__ import annotations

import subprocess
import sys

import httpx
import numpy as np

from tests.conftest import REPO


def steady(server, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:  # noqa: ANN001
    env = {**server.env, "STEADY_SERVER": server.url, "STEADY_TOKEN": server.tokens["user"], "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, cwd=REPO, input=input,
                          capture_output=True, text=True, check=check, timeout=120)


def test_submit_status_report(live_server, tmp_path):
    spec = tmp_path / "study.yaml"
    spec.write_text(
        "name: cli study\nworkload: {framework: torch, name: torch_mlp}\nseeds: [0, 1, 2]\n"
        "determinism: [seeded]\nmetrics: [loss]\n"
    )
    out = steady(live_server, "submit", str(spec)).stdout
    assert "submitted study 1" in out and "3 runs" in out
    status = steady(live_server, "status").stdout
    assert "cli study" in status and "0/3 runs" in status

    bad = steady(live_server, "submit", "-", input="name: x\nseeds: []\nworkload: {framework: torch, name: torch_mlp}\n",
                 check=False)
    assert bad.returncode == 1 and "422" in bad.stderr and "at least one seed" in bad.stderr

    # an external study with uploaded runs gets a readable report
    with live_server.client() as c:
        sid = c.post("/api/v1/studies", json={"name": "imported", "kind": "external",
                                             "metrics": [{"name": "loss", "max_std": 0.5}]}).json()["id"]
        rng = np.random.default_rng(0)
        for seed in range(6):
            for repeat in range(2):
                values = (np.linspace(1, 0.1, 20) + 0.01 * seed).tolist()
                r = c.post(f"/api/v1/studies/{sid}/runs", json={
                    "seed": seed, "repeat": repeat, "determinism": "strict", "stack": {"name": "cpu"},
                    "metrics": {"loss": {"steps": list(range(20)), "values": values}},
                    "step_times": (0.01 + rng.normal(0, 1e-4, 20)).tolist()})
                assert r.status_code == 201
    report = steady(live_server, "report", str(sid)).stdout
    assert "1. Repeatability" in report and "identical" in report and "2. Seed stability" in report
    assert "stable" in report
    as_json = steady(live_server, "report", str(sid), "--json").stdout
    assert '"verdicts"' in as_json


def test_token_commands_and_errors(live_server):
    env = live_server.env
    listed = subprocess.run([sys.executable, "-m", "app.cli", "token", "list"], env=env, cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    assert "admin" in listed and "worker" in listed and "stdy_" in listed
    assert live_server.tokens["user"] not in listed  # only prefixes are ever shown
    r = httpx.get(live_server.url + "/api/v1/studies", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    no_server = subprocess.run([sys.executable, "-m", "app.cli", "status", "--server", "http://127.0.0.1:9"],
                               env=env, cwd=REPO, capture_output=True, text=True)
    assert no_server.returncode == 1 and "cannot reach" in no_server.stderr


def test_control_characters_in_names_never_reach_the_terminal(live_server):
    evil = "ok\x1b]0;pwned\x07\x1b[2J\x9b31m\rname"
    with live_server.client() as c:
        sid = c.post("/api/v1/studies", json={"name": evil, "kind": "external",
                                             "metrics": [{"name": "loss"}]}).json()["id"]
        r = c.post(f"/api/v1/studies/{sid}/runs", json={
            "seed": 0, "determinism": "seeded", "stack": {"name": "gpu\x1b[31m"},
            "metrics": {"loss": {"steps": [0, 1], "values": [1.0, 0.5]}}})
        assert r.status_code == 201, r.text
    for out in (steady(live_server, "status").stdout, steady(live_server, "report", str(sid)).stdout):
        assert "okname" in out.replace("]0;pwned", "").replace("[2J", "").replace("31m", "")
        assert not any(ch in out for ch in "\x1b\x07\x9b\r")


def test_calibrate_prints_the_table_and_writes_json_and_the_doc_block(tmp_path):
    import json

    doc = tmp_path / "cal.md"
    doc.write_text("intro\n<!-- calibration-table:start -->\nold\n<!-- calibration-table:end -->\n"
                   "<!-- power-table:start -->\n<!-- power-table:end -->\nend\n")
    out = subprocess.run([sys.executable, "-m", "app.cli", "calibrate", "--sims", "20", "--rule", "repeatability",
                          "--json", str(tmp_path / "cal.json"), "--power-sims", "10", "--update-doc", str(doc)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "repeatability" in out.stdout and "identical-3x500" in out.stdout and "95% CI" in out.stdout
    data = json.loads((tmp_path / "cal.json").read_text())
    rows = {r["scenario"]: r for r in data["rates"]}
    assert rows["identical-3x500"]["k"] == 0 and rows["one-ulp-3x500"]["k"] == 20
    assert [p["seeds"] for p in data["oob_power_offsets"]] == [5, 10, 20]
    text = doc.read_text()
    assert "old" not in text and "| `repeatability` | `identical-3x500` | healthy |" in text and text.endswith("end\n")
    bad = subprocess.run([sys.executable, "-m", "app.cli", "calibrate", "--rule", "nope"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no rule named" in bad.stderr
