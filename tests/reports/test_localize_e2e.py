"""A user's own PyTorch script with a nondeterministic op in one custom layer, submitted as a command
from a fresh git folder: `steady localize` names that op and that layer, and `steady report` shows it.

The layer adds jitter drawn from a generator nobody seeded (`torch.Generator().seed()`), so two repeats
at `strict` part although every seed Steady sets is set. The study records step digests
(`localize: steps`), so the localization replays only the divergent step. A real `steady serve` (the shared one), a
real worker for the study's runs, and the replays run by `steady localize` itself: the process
boundaries are the point.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import run_cli_in_process, user_project
from tests.worker.test_worker_agent_e2e import Worker
from tests.gitfolder import user_env

SCRIPT = """
    import argparse

    import torch
    from torch import nn


    class JitterPool(nn.Module):
        \"\"\"Averages pairs of features, with a little jitter (from a generator nobody seeded).\"\"\"

        def __init__(self):
            super().__init__()
            self.gen = torch.Generator()
            self.gen.seed()

        def forward(self, h):
            noise = torch.empty_like(h).uniform_(-1e-6, 1e-6, generator=self.gen)
            return (h + noise).reshape(h.shape[0], -1, 2).mean(-1)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 16)
            self.pool = JitterPool()
            self.out = nn.Linear(8, 1)

        def forward(self, x):
            return self.out(self.pool(torch.relu(self.fc(x))))


    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        opt.zero_grad()
        batch = slice(step * 8, (step + 1) * 8)
        loss = ((model(x[batch]) - y[batch]) ** 2).mean()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.9f}", flush=True)
"""

SPEC = """
    name: localize-own-script
    workload:
      framework: torch
      command: ["python", "train.py", "--seed", "{seed}"]
    seeds: [1]
    repeats: 2
    determinism: [strict]
    threads: 1
    max_attempts: 1
    localize: steps
    metrics: [{name: loss, max_std: 1.0}]
"""


def _project(root: Path) -> Path:
    return user_project(root, {"train.py": SCRIPT, "study.yaml": SPEC})


@pytest.mark.slow
def test_own_script_with_a_jittering_layer_gets_the_op_and_the_layer_named(live_server, tmp_path):
    folder = _project(tmp_path / "project")
    env = user_env(live_server, folder)
    (tmp_path / "worker-home").mkdir()
    worker = Worker(live_server, tmp_path, "localize", "--concurrency", "2", cwd=tmp_path / "worker-home")
    try:
        submit = run_cli_in_process("submit", "study.yaml", "--wait", env=env, cwd=folder)
    finally:
        worker.stop()
    found = re.search(r"submitted study (\d+)", submit.stdout + submit.stderr)
    assert found, (submit.stdout, submit.stderr, worker.log())
    sid = found.group(1)

    # the replays run here, in the user's folder: no worker needed
    loc = run_cli_in_process("localize", sid, env=env, cwd=folder)
    assert loc.returncode == 0, (loc.stdout, loc.stderr)
    want = "first divergent op: `aten::uniform_` in `Net.pool` (forward) at train.py:16, step 0, " \
           "inputs identical → the op itself"
    assert want in loc.stdout, loc.stdout
    # the runs recorded their step digests (`localize: steps`): the step is known, only it is replayed
    assert "the runs' recorded step digests part at step 0" in loc.stderr, loc.stderr
    assert "(2 replays; kept in the study's report)" in loc.stdout

    report = run_cli_in_process("report", sid, env=env, cwd=folder)
    assert want in report.stdout, report.stdout
    from steady.server.reports.models import Report

    body = Report.model_validate_json(run_cli_in_process("report", sid, "--json", env=env, cwd=folder).stdout)
    (verdict,) = body.of_level("repeatability")
    assert verdict.verdict != "identical"
    got = verdict.localization
    assert got is not None and got.status == "localized" and got.replays == 2
    assert (got.answer.op, got.answer.module, got.answer.phase, got.answer.line) == (
        "aten::uniform_", "Net.pool", "forward", "train.py:16")
    assert set(got.run_ids) == set(verdict.per_seed[0].run_ids)

    # the study page's verdict shows it; the run pages of both runs too, each linking to the other
    with live_server.client() as c:
        page = c.get(f"/studies/{sid}")
        assert page.status_code == 200 and "data-localization" in page.text
        assert "first divergent op: `aten::uniform_` in `Net.pool` (forward) at train.py:16" in page.text
        for me, other in (got.run_ids, got.run_ids[::-1]):
            page = c.get(f"/runs/{me}")
            assert page.status_code == 200
            assert f'<a href="/runs/{other}">run {other}</a>' in page.text
            assert "aten::uniform_" in page.text and "Net.pool" in page.text and "train.py:16" in page.text

    # two runs that are not repeats of one another, or of another study: 422 naming the field
    with live_server.client() as c:
        bad = c.post(f"/api/v1/studies/{sid}/localizations",
                     json={**got.model_dump(mode="json", exclude={"localized_at"}), "run_ids": [got.run_ids[0]] * 2})
    assert bad.status_code == 422 and "run_ids" in bad.text, bad.text
