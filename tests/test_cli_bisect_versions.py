"""`steady bisect NAME==A NAME==B` end to end, without the internet: a tiny package (``plantedlib``) is written
as wheels 1.0.0 to 1.7.0 (and a 1.6.0rc1) into a local folder, served to pip through PIP_FIND_LINKS and
PIP_NO_INDEX in the CLI's and the worker's environment. From 1.5.0 on, its ``loss`` adds an unseeded jitter, so
two repeats of one seed differ. The CLI resolves the versions between (pip index versions: the pre-release left
out), each point is a study of the working tree's code on a stack pinning that version, the worker runs it in a
cached environment with that version installed, and the answer names 1.5.0. With a time budget (the test's
clock) no point starts once it is spent: the answer is the range the judged points leave. A stack pinning a version the index
does not have fails its runs with kind ``environment``, never running on another version."""

from __future__ import annotations

import re
import textwrap

import pytest

from tests.conftest import run_cli_in_process
from tests.gitfolder import user_env
from tests.wheels import write_wheel
from tests.worker.test_worker_agent_e2e import Worker, wait_for

VERSIONS = ("1.0.0", "1.1.0", "1.2.0", "1.3.0", "1.4.0", "1.5.0", "1.6.0", "1.7.0")
PLANTED = "1.5.0"

LIB = """
    import random

    VERSION = {version!r}


    def loss(seed, step):
        value = 1.0 / (3 * (1 + step)) + seed * 1e-3
        {jitter}
        return value
"""

TRAIN = """
    import argparse

    import plantedlib

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    seed = p.parse_args().seed
    for step in range(3):
        print(f"step {step} loss {plantedlib.loss(seed, step)!r}", flush=True)
"""

SPEC = """
    name: planted-lib
    workload:
      framework: python
      command: ["python", "train.py", "--seed", "{seed}"]
    seeds: [0]
    repeats: 2
    determinism: [strict]
    threads: 1
    max_attempts: 1
    metrics: [loss]
"""


def _wheels(folder):
    for v in (*VERSIONS, "1.6.0rc1"):
        jitter = "value += random.Random().random() * 1e-6  # a fresh, unseeded generator" if v >= PLANTED else ""
        write_wheel(folder, "plantedlib", v,
                    {"plantedlib/__init__.py": textwrap.dedent(LIB).lstrip().format(version=v, jitter=jitter)})


@pytest.mark.slow
def test_the_first_version_that_breaks_repeatability_is_named(live_server, tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    _wheels(wheels)
    pip_env = {"PIP_FIND_LINKS": str(wheels), "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for k, v in pip_env.items():
        monkeypatch.setenv(k, v)  # the worker's environment (it inherits this process's)
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "study.yaml").write_text(textwrap.dedent(SPEC).lstrip())
    (folder / "train.py").write_text(textwrap.dedent(TRAIN).lstrip())
    env = {**user_env(live_server, folder), **pip_env}
    (tmp_path / "worker-home").mkdir()
    worker = Worker(live_server, tmp_path, "versions", "--concurrency", "2", cwd=tmp_path / "worker-home")
    try:
        got = run_cli_in_process("bisect", "plantedlib==1.0.0", "plantedlib==1.7.0", "--poll", "0.3",
                                 "--", "study.yaml", env=env, cwd=folder)
        out, err = got.stdout, got.stderr
        assert got.returncode == 0, (out, err, worker.log())
        # the versions between, from the index, in PEP 440 order; the pre-release is not one of them
        assert ("plantedlib versions from the package index (pip index versions), GOOD to BAD: 1.0.0, 1.1.0, 1.2.0, "
                "1.3.0, 1.4.0, 1.5.0, 1.6.0, 1.7.0") in err, err
        assert "bisecting 6 versions between plantedlib 1.0.0 and plantedlib 1.7.0" in err, err
        assert "first version where repeatability changed: plantedlib 1.5.0" in out, out
        before = re.search(r"at the version before it, plantedlib 1\.4\.0: good: identical: every repeat equal at "
                           r"the 16 printed decimals.*\(study (\d+), 2 runs\)", out)
        at = re.search(r"at plantedlib 1\.5\.0: bad: repeats differ.*\(study (\d+), 2 runs\)", out)
        assert before and at, out
        span = "plantedlib-1.0.0..plantedlib-1.7.0"
        assert f"dashboard: {live_server.url}/bisects/{span}" in out, out
        with live_server.client() as c:
            # each point is a study whose one stack pins its version; its runs ran on that version
            study = c.get(f"/api/v1/studies/{at.group(1)}").json()
            assert study["spec"]["stacks"] == [{"name": "plantedlib-1.5.0", "labels": [],
                                                "packages": {"plantedlib": "1.5.0"}}]
            assert "point 5 of 7, version plantedlib==1.5.0" in study["spec"]["description"]
            page = c.get(f"/bisects/{span}")
            assert page.status_code == 200, page.text
            assert ("First version where repeatability changed: <strong><code>plantedlib 1.5.0</code></strong>"
                    in page.text), page.text

            # --budget-minutes, on the test's clock: 3 minutes pass at each reading, so the ends start (3 < 5),
            # no point after them (6 >= 5); the answer is what the ends decide, and why it stopped
            readings = iter(range(0, 100 * 180, 180))
            monkeypatch.setattr("steady.server.cli.bisect._clock", lambda: float(next(readings)))
            timed = run_cli_in_process("bisect", "plantedlib==1.0.0", "plantedlib==1.7.0", "--budget-minutes", "5",
                                       "--poll", "0.3", "--", "study.yaml", env=env, cwd=folder)
            assert timed.returncode == 2, (timed.stdout, timed.stderr)
            assert "no point started after 5 minutes" in timed.stderr, timed.stderr
            assert re.findall(r"point (\d+) plantedlib \S+: (?:good|bad)", timed.stderr) == ["0", "7"], timed.stderr
            assert ("undecided between plantedlib 1.0.0 and plantedlib 1.7.0: the first change is one of the 7 "
                    "versions after plantedlib 1.0.0") in timed.stdout, timed.stdout
            assert ("the budget of 5 minutes is spent (9.0 minutes used): no point was started after it; raise "
                    "--budget-minutes") in timed.stdout, timed.stdout

            # a version the index does not have: the runs fail with why, they do not run on another version
            bad = c.post("/api/v1/studies", json={
                "name": "missing version", "workload": {"framework": "python", "command": ["python", "train.py",
                                                                                            "--seed", "{seed}"]},
                "code": study["spec"]["code"], "seeds": [0], "max_attempts": 1, "metrics": ["loss"],
                "stacks": [{"name": "missing", "packages": {"plantedlib": "9.9.9"}}]})
            assert bad.status_code == 201, bad.text
            sid = bad.json()["id"]
            wait_for(lambda: c.get(f"/api/v1/studies/{sid}").json()["status"] in ("failed", "completed"), 120,
                     "the study with a missing version to end")
            run = c.get(f"/api/v1/studies/{sid}/runs").json()["items"][0]
            assert run["status"] == "failed" and run["failure_kind"] == "environment", run
            assert "could not build the stack's environment: pip install plantedlib==9.9.9" in run["error"], run
            assert "No matching distribution found for plantedlib==9.9.9" in run["error"], run
    finally:
        worker.stop()
