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


def _ci_env(server) -> dict[str, str]:
    """A CI job's environment: `steady` on PATH, the server and a user token in the environment."""
    env = {k: v for k, v in server.env.items() if not k.startswith("STEADY_")}
    return {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "STEADY_SERVER": server.url, "STEADY_TOKEN": server.tokens["user"], "NO_COLOR": "1"}


@pytest.mark.slow
def test_ci_script_submits_a_study_with_a_budget_waits_and_gates(live_server, tmp_path):
    """Real runs on a real worker (a NumPy script: the gate's logic does not need a framework, whose
    import would cost seconds per run). 3 seeds are too few to claim a band (inconclusive); the budget lets
    the server add a stage of 3 more seeds, after which the band is claimed: the job passes, exit 0."""
    train = tmp_path / "train.py"
    train.write_text(
        "import numpy as np\nfrom steady import sdk\n\n"
        "w = np.random.standard_normal(8)  # NumPy's generator, seeded by the worker\n"
        "for step in range(30):\n"
        "    w -= 0.1 * (w - 0.5) + 0.01 * np.random.standard_normal(8)\n"
        "    sdk.log(step=step, loss=float(np.mean((w - 0.5) ** 2)))\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for argv in (["git", "init", "-q"], [*git, "add", "train.py"], [*git, "commit", "-qm", "train"]):
        subprocess.run(argv, cwd=tmp_path, check=True)  # the code a CI job checks out: a git repository
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: gate\nworkload: {framework: python, entrypoint: train.py}\n"
        "seeds: [0, 1, 2]\nrepeats: 2\ndeterminism: [strict]\nthreads: 1\n"
        "budget: {max_seeds: 6, stage_seeds: 3}\n"
        "metrics: [{name: loss, max_std: 1.0}]\n")
    script = str(REPO / "examples" / "ci-gate.sh")
    before = live_server.study_ids()
    worker = Worker(live_server, tmp_path, "gate-worker")
    try:
        job = subprocess.run(["bash", script, str(spec), str(tmp_path / "out")],
                             env=_ci_env(live_server), cwd=tmp_path, capture_output=True, text=True, timeout=900,
                             check=False)
    finally:
        worker.stop()
    assert job.returncode == 0, (job.stdout, job.stderr, worker.log())
    assert "steady gate: passed" in job.stdout
    suite = ET.parse(tmp_path / "out" / "junit.xml").getroot().find("testsuite")
    status = {(c.get("classname"), c.get("name").split(" ")[0]): [x.tag for x in c if x.tag != "system-out"]
              for c in suite.iter("testcase")}
    assert status[("steady.expectation", "strict:")] == [] and status[("steady.repeatability", "loss")] == []
    assert status[("steady.seed_stability", "loss")] == [], status
    assert suite.get("failures") == "0" and suite.get("skipped") == "0"
    (sid,) = live_server.study_ids() - before
    assert f"/studies/{sid}" in (tmp_path / "out" / "summary.md").read_text()
    with live_server.client() as c:
        study = c.get(f"/api/v1/studies/{sid}").json()
        runs = c.get(f"/api/v1/studies/{sid}/runs", params={"limit": 100}).json()
    assert study["stage"]["stage"] == 2 and study["stage"]["seeds"] == 6, study["stage"]
    items = runs["items"] if isinstance(runs, dict) else runs
    assert sorted({r["seed"] for r in items}) == [0, 1, 2, 3, 4, 5]


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

    # bad input: one line, no traceback, exit 3 (could not judge), never 2 (inconclusive)
    missing = check("no-such-spec.yaml")
    assert missing.returncode == 3 and "no such file" in missing.stderr and "Traceback" not in missing.stderr
    nobase = check(str(shifted), "--against", "nosuch")
    assert nobase.returncode == 3 and "has no baseline" in nobase.stderr


def _upgrade_study(post, *, shift: float, rng: np.random.Generator) -> int:
    """A stack upgrade as a CI job would measure it: 6 seeds × 2 bitwise repeats on the old and the
    new stack, final loss within max_std, compared within an equivalence margin of 0.1."""
    r = post("/api/v1/studies", json={"name": f"upgrade shift={shift}", "kind": "external",
                                      "stacks": [{"name": "old"}, {"name": "new"}], "reference_stack": "old",
                                      "metrics": [{"name": "loss", "max_std": 1.0, "margin": 0.1}]})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    for stack, offset in (("old", 0.0), ("new", shift)):
        for seed in range(6):
            final = 1.0 + offset + 0.01 * rng.standard_normal()
            curve = (final + np.exp(-np.arange(10) / 3.0)).tolist()
            curve[-1] = final
            for repeat in range(2):
                r = post(f"/api/v1/studies/{sid}/runs", json={
                    "seed": seed, "repeat": repeat, "determinism": "strict", "stack": {"name": stack},
                    "metrics": {"loss": {"steps": list(range(10)), "values": curve}}})
                assert r.status_code == 201, r.text
    return sid


@pytest.mark.slow  # a live server: ~15-30 s on a loaded 2-core machine
def test_ci_script_fails_a_planted_upgrade_shift_and_passes_an_unchanged_stack(live_server, tmp_path):
    rng = np.random.default_rng(7)
    with live_server.client() as c:
        unchanged = _upgrade_study(c.post, shift=0.0, rng=rng)
        shifted = _upgrade_study(c.post, shift=0.5, rng=rng)
    script = str(REPO / "examples" / "ci-gate.sh")

    def gate(study: int, out: str) -> tuple[subprocess.CompletedProcess, ET.Element]:
        job = subprocess.run(["bash", script, str(study), str(tmp_path / out)], env=_ci_env(live_server),
                             cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
        return job, ET.parse(tmp_path / out / "junit.xml").getroot().find("testsuite")

    job, suite = gate(unchanged, "unchanged")
    assert job.returncode == 0 and "steady gate: passed" in job.stdout, (job.stdout, job.stderr)
    port = [c for c in suite.iter("testcase") if c.get("classname") == "steady.stack_portability"]
    assert port and all(c.find("failure") is None and c.find("skipped") is None for c in port)

    job, suite = gate(shifted, "shifted")
    assert job.returncode == 1 and "FAILED" in job.stdout, (job.stdout, job.stderr)
    failed = [c.get("classname") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed == ["steady.stack_portability"], failed


RCP = {"mean": 215040, "std": 11976.9, "n": 18}  # a published MLPerf reference point


@pytest.mark.slow  # a live server: ~15-30 s on a loaded 2-core machine
def test_check_fails_a_study_converging_too_fast_and_exits_3_when_it_cannot_judge(live_server, tmp_path):
    import junitparser

    env = _ci_env(live_server)

    def check(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["steady", "check", *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, check=False)

    with live_server.client() as c:
        r = c.post("/api/v1/studies", json={
            "name": "fast", "kind": "external", "metrics": [{"name": "loss", "max_std": 1.0}],
            "convergence": {"metric": "loss", "target": 0.1, "direction": "min", "reference": RCP}})
        assert r.status_code == 201, r.text
        fast = r.json()["id"]
        for seed in range(10):  # olympic mean 194500 steps, below the minimum acceptable 206333
            hit = 190000 + 1000 * seed
            for repeat in range(2):
                r = c.post(f"/api/v1/studies/{fast}/runs", json={
                    "seed": seed, "repeat": repeat, "determinism": "strict", "stack": {"name": "cpu"},
                    "metrics": {"loss": {"steps": [0, hit - 1000, hit, hit + 1000],
                                         "values": [1.0 + 0.001 * seed, 0.2, 0.1, 0.05]}}})
                assert r.status_code == 201, r.text
        queued = c.post("/api/v1/studies", json={
            "name": "never run", "workload": {"framework": "torch", "name": "torch_mlp"}, "seeds": [0],
            "metrics": [{"name": "loss"}]}).json()["id"]
        assert c.post(f"/api/v1/studies/{queued}/cancel").status_code == 200

    failed = check(str(fast), "--junit", "fast.xml")
    assert failed.returncode == 1, (failed.stdout, failed.stderr)
    (ts,) = list(junitparser.JUnitXml.fromfile(str(tmp_path / "fast.xml")))
    outcome = {(case.classname, case.name): [type(r).__name__ for r in case.result] for case in ts}
    assert outcome.pop(("steady.convergence", "steps to loss<=0.1 strict/cpu")) == ["Failure"], outcome
    assert all(v == [] for v in outcome.values()), outcome  # the other checks of the study pass
    (case,) = [case for case in ts if case.classname == "steady.convergence"]
    assert "minimum acceptable mean 206333" in case.result[0].message

    unknown = check("999", "--junit", "unknown.xml")
    assert unknown.returncode == 3 and "404" in unknown.stderr, (unknown.stdout, unknown.stderr)
    assert not (tmp_path / "unknown.xml").exists()
    cancelled = check(str(queued))
    assert cancelled.returncode == 3 and "cancelled" in cancelled.stderr, (cancelled.stdout, cancelled.stderr)
    refused = subprocess.run(["steady", "check", str(fast)], env={**env, "STEADY_TOKEN": "wrong"}, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 3 and "401" in refused.stderr
