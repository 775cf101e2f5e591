"""`steady check` as a CI job runs it: a real `steady serve`, a real worker, the committed shell script."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from tests.alerts.conftest import Receiver, external_study
from tests.conftest import REPO
from tests.worker.test_worker_agent_e2e import Worker


def _ci_env(server) -> dict[str, str]:  # noqa: ANN001
    """A CI job's environment: `steady` on PATH, the server and a user token in the environment."""
    env = {k: v for k, v in server.env.items() if not k.startswith("STEADY_")}
    return {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "STEADY_SERVER": server.url, "STEADY_TOKEN": server.tokens["user"], "NO_COLOR": "1",
            "PYTHONPATH": str(REPO)}


@pytest.mark.slow
def test_ci_script_submits_waits_and_gates(live_server, tmp_path):
    """Real training runs: repeats identical (strict), but 3 seeds are too few to claim a band: exit 2."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: gate\nworkload: {framework: torch, name: torch_mlp, params: {epochs: 1}}\n"
        "seeds: [0, 1, 2]\nrepeats: 2\ndeterminism: [strict]\nthreads: 1\n"
        "metrics: [{name: loss, max_std: 1.0}]\n")
    script = str(REPO / "examples" / "ci-gate.sh")
    worker = Worker(live_server, tmp_path, "gate-worker")
    try:
        job = subprocess.run(["bash", script, str(spec), str(tmp_path / "out")],
                             env=_ci_env(live_server), cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    finally:
        worker.stop()
    assert job.returncode == 2, (job.stdout, job.stderr, worker.log())
    assert "steady gate: inconclusive" in job.stdout
    suite = ET.parse(tmp_path / "out" / "junit.xml").getroot().find("testsuite")
    status = {(c.get("classname"), c.get("name").split(" ")[0]): [x.tag for x in c if x.tag != "system-out"]
              for c in suite.iter("testcase")}
    assert status[("steady.expectation", "strict:")] == [] and status[("steady.repeatability", "loss")] == []
    assert status[("steady.seed_stability", "loss")] == ["skipped"], status
    skipped = next(c for c in suite.iter("testcase") if c.find("skipped") is not None)
    assert "minimum 5" in skipped.find("skipped").get("message")
    assert suite.get("failures") == "0" and suite.get("skipped") == "1"
    assert "/studies/1" in (tmp_path / "out" / "summary.md").read_text()
    # the same study again, by id, in a job that lets an inconclusive study through
    again = subprocess.run(["bash", script, "1", str(tmp_path / "again")], capture_output=True, text=True,
                           env={**_ci_env(live_server), "STEADY_INCONCLUSIVE_OK": "1"}, cwd=tmp_path, timeout=120,
                           check=False)
    assert again.returncode == 0 and "inconclusive" in again.stdout, (again.stdout, again.stderr)


@pytest.mark.slow  # a live server: ~15-30 s on a loaded 2-core machine
def test_check_of_a_study_exit_codes_outputs_and_webhook(live_server, tmp_path):
    env = _ci_env(live_server)
    rng = np.random.default_rng(2)
    with live_server.client() as c:
        base = external_study(c.post, suite="s", finals=(1.0 + 0.01 * rng.standard_normal(6)).tolist())
        shifted = external_study(c.post, suite="s", finals=(1.2 + 0.01 * rng.standard_normal(6)).tolist())
        r = c.put("/api/v1/suites/s/baseline", json={"study_id": base, "reason": "nightly of Monday"})
        assert r.status_code == 200, r.text

    def check(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["steady", "check", *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, check=False)

    # 5 seeds × 2 bitwise repeats within max_std: every check passes
    with live_server.client() as c:
        good = c.post("/api/v1/studies", json={"name": "good", "kind": "external",
                                               "metrics": [{"name": "loss", "max_std": 1.0}]}).json()["id"]
        for seed in range(5):
            for repeat in range(2):
                curve = (1.0 + 0.01 * seed + np.exp(-np.arange(10) / 3.0)).tolist()
                r = c.post(f"/api/v1/studies/{good}/runs", json={
                    "seed": seed, "repeat": repeat, "determinism": "strict", "stack": {"name": "cpu"},
                    "metrics": {"loss": {"steps": list(range(10)), "values": curve}}})
                assert r.status_code == 201, r.text
    passed = check(str(good), "--junit", "good.xml")
    assert passed.returncode == 0, (passed.stdout, passed.stderr)
    assert "passed (exit 0)" in passed.stdout
    suite = ET.parse(tmp_path / "good.xml").getroot().find("testsuite")
    assert suite.get("failures") == suite.get("skipped") == "0" and int(suite.get("tests")) == 3

    # no repeats and no max_std: nothing fails, nothing can be claimed
    plain = check(str(shifted), "--junit", "plain.xml")
    assert plain.returncode == 2, (plain.stdout, plain.stderr)
    assert "inconclusive (exit 2)" in plain.stdout
    assert ET.parse(tmp_path / "plain.xml").getroot().find("testsuite").get("failures") == "0"

    receiver = Receiver()
    try:
        against = check(str(shifted), "--against", "s", "--junit", "against.xml", "--markdown", "against.md",
                        "--webhook", receiver.url)
        (message,) = receiver.wait_for(1)
    finally:
        receiver.close()
    assert against.returncode == 1, (against.stdout, against.stderr)
    suite = ET.parse(tmp_path / "against.xml").getroot().find("testsuite")
    failed = [c for c in suite.iter("testcase") if c.find("failure") is not None]
    assert [c.get("classname") for c in failed] == ["steady.baseline"]
    assert "not_equivalent" in failed[0].find("failure").get("message")
    md = (tmp_path / "against.md").read_text()
    assert md.startswith(f"### Steady gate: study {shifted} (nightly) against the baseline of s: FAILED (exit 1)")
    assert f"{live_server.url}/studies/{shifted}" in md and "_Guarantee: " in md
    assert message["json"]["text"] == md and message["json"]["exit_code"] == 1

    # bad input: one line, no traceback
    missing = check("no-such-spec.yaml")
    assert missing.returncode == 2 and "no such file" in missing.stderr and "Traceback" not in missing.stderr
    nobase = check(str(shifted), "--against", "nosuch")
    assert nobase.returncode == 1 and "has no baseline" in nobase.stderr
