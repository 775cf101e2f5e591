"""A third-party training script, byte for byte as published (e3nn 0.6.0's ``examples/tetris.py``,
MIT, fetched from its PyPI source archive by ``tests.fetched``, hashes pinned there), is judged
without a change: copied into a fresh git repository, submitted as a command workload with
``steady submit --wait`` to a worker that runs in another directory. The script seeds nothing and
only prints ``epoch N | loss X | A% accuracy`` lines; a capture pattern reads them. The worker's
shim seeds torch at ``seeded``, so its repeats are identical on CPU, and the optimizer hook records
their initial weights without the SDK.

Each run of this script costs about 44 s of CPU (300 e3nn steps), the most of any run in the suite, so
it runs at ``seeded`` only. What the other levels do with a script that seeds nothing is shown on
cheaper scripts: at ``none`` repeats differ and the report says so with the expectation met
(tests/reports/test_user_scripts_e2e.py, through the server and the CLI) and the optimizer hook's
automatic digests blame seeding (tests/worker/test_autodigest.py); ``strict`` adds deterministic
kernels on top of ``seeded`` (the controls and determinism tests).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.fetched import SCRIPTS, fetch
from tests.worker.test_worker_agent_e2e import runs, series, workers  # noqa: F401 - workers is a fixture

pytestmark = pytest.mark.slow

SPEC = r"""
    name: e3nn tetris, unmodified
    workload:
      framework: torch
      command: ["python", "tetris.py"]
      capture:
        patterns:
          - 'epoch\s+(?P<step>\d+) \| loss (?P<loss>[-+.\deE]+)\s+\|\s+(?P<accuracy>[.\d]+)% accuracy'
    seeds: [1]
    repeats: 2
    determinism: [seeded]
    threads: 1
    max_attempts: 1
    metrics: [loss]
"""


def test_the_fetched_script_is_the_published_one():
    folder = fetch("e3nn_tetris")
    assert sorted(p.name for p in folder.iterdir()) == ["LICENSE", "tetris.py"]
    assert hashlib.sha256((folder / "tetris.py").read_bytes()).hexdigest() == \
        SCRIPTS["e3nn_tetris"].files["examples/tetris.py"]
    assert "def tetris()" in (folder / "tetris.py").read_text()


def _repo(root: Path) -> Path:
    shutil.copytree(fetch("e3nn_tetris"), root)  # tetris.py and e3nn's LICENSE, hashes checked
    (root / "study.yaml").write_text(textwrap.dedent(SPEC).lstrip())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "e3nn tetris example, unmodified"], cwd=root, check=True)
    return root


def _submit_wait(server, spec: Path) -> subprocess.CompletedProcess:
    # as tests.worker.test_code_shipping_e2e._submit, with room for two ~44 CPU-s runs on a loaded machine
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEADY_")}
    env.update(XDG_CONFIG_HOME=str(spec.parent / ".config"))
    return subprocess.run(
        [sys.executable, "-m", "steady.server.cli", "submit", spec.name, "--server", server.url,
         "--token", server.tokens["user"], "--wait"],
        cwd=spec.parent, env=env, capture_output=True, text=True, timeout=1200, check=False,
    )


@pytest.mark.timeout(1200)  # two ~44 CPU-s runs, one after another, on a loaded machine
def test_an_unmodified_third_party_script_is_judged(live_server, workers, tmp_path):  # noqa: F811
    pytest.importorskip("e3nn")
    pytest.importorskip("torch_geometric")
    http = live_server.client()
    repo = _repo(tmp_path / "proj")
    (tmp_path / "worker-home").mkdir()
    w = workers(live_server, "w1", cwd=tmp_path / "worker-home")
    done = _submit_wait(live_server, repo / "study.yaml")
    # judged: the seeded repeats are identical. One seed cannot show a seed band, and the spec gives no
    # max_std: seed stability is shown as information, not asked, so the study passes on what it asks (exit 0)
    assert done.returncode == 0, done.stdout + done.stderr + w.log()
    assert ": passed: " in done.stderr and "not asked" in done.stderr, done.stderr
    sid = int(done.stdout.split("submitted study ")[1].split()[0])
    items = runs(http, sid)
    assert len(items) == 2 and {r["status"] for r in items} == {"completed"}, items
    (ra, la, aa), (rb, lb, ab) = [(r, series(http, r["id"], "loss"), series(http, r["id"], "accuracy")) for r in items]
    for r, loss, acc in ((ra, la, aa), (rb, lb, ab)):
        assert loss[0] == acc[0] == list(range(0, 300, 10))  # 300 Adam steps, every 10th printed
        assert r["final_metrics"]["loss"] == loss[1][-1]
        assert r["digests"]["initial_weights"], r  # recorded by the optimizer hook, no SDK involved
        assert r["determinism"] == "seeded"
    assert la == lb and aa == ab  # the shim's seeding made the unchanged script repeatable
    assert ra["digests"]["initial_weights"] == rb["digests"]["initial_weights"]
    report = http.get(f"/api/v1/studies/{sid}/report").json()
    judged = {v["group"]["determinism"]: v for v in report["verdicts"]
              if v["level"] == "repeatability" and v["metric"] == "loss"}
    assert judged["seeded"]["verdict"] == "identical" and judged["seeded"]["met_expectation"] is True
    assert judged["seeded"]["dtype"] == "float64"
