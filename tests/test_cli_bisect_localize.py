"""`steady bisect` carries a repeatability break through to the first divergent op at the commit it names.

A user's PyTorch script in a git repository of three commits: GOOD trains a tiny MLP, the next commit adds a
dropout drawing its mask from a generator nobody seeded (repeats at `strict` part), BAD tunes a comment. The
bisect names the dropout's commit, asks a worker to localize that commit's diverging repeats (the localization
job of the dashboard's Localize button) and prints the op the replays name. A real worker and the live server:
the process boundaries are the point. That the replays name such an op at all is tests/reports/test_localize_e2e.py;
the pure-Python history of tests/test_cli_bisect.py gets the sentence saying why no op is named.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import run_cli_in_process
from tests.gitfolder import commit_next, user_env
from tests.worker.test_worker_agent_e2e import Worker

TRAIN = """
    import argparse

    import torch
    from torch import nn


    class Dropout(nn.Module):
        \"\"\"Drops features, with a generator of its own.\"\"\"

        def __init__(self, p):
            super().__init__()
            self.p, self.gen = p, torch.Generator()
            self.gen.seed()

        def forward(self, h):
            keep = torch.empty_like(h).bernoulli_(1 - self.p, generator=self.gen)
            return h * keep / (1 - self.p)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(4, 8)
            self.drop = {drop}
            self.out = nn.Linear(8, 1)

        def forward(self, x):
            return self.out(self.drop(torch.relu(self.fc1(x))))


    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    torch.manual_seed(p.parse_args().seed)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):  # {edit}
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        print(f"step {{step}} loss {{loss.item()!r}}", flush=True)
"""

SPEC = """
    name: tiny-torch
    workload:
      framework: torch
      command: ["python", "train.py", "--seed", "{seed}"]
    seeds: [1]
    repeats: 2
    determinism: [strict]
    threads: 1
    max_attempts: 1
    localize: steps
    metrics: [loss]
"""

COMMITS = [("tiny torch script", "nn.Identity()"), ("add dropout after fc1", "Dropout(0.5)"),
           ("tune comment", "Dropout(0.5)")]
BREAK = 1


def _history(root: Path) -> list[str]:
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / "study.yaml").write_text(textwrap.dedent(SPEC).lstrip())
    shas = []
    for i, (message, drop) in enumerate(COMMITS):
        (root / "train.py").write_text(textwrap.dedent(TRAIN).lstrip().format(drop=drop, edit=i))
        shas.append(commit_next(root, message))
    return shas


@pytest.mark.slow
def test_the_bisect_names_the_first_divergent_op_at_the_commit_it_finds(live_server, tmp_path):
    folder = tmp_path / "project"
    shas = _history(folder)
    env = user_env(live_server, folder)
    (tmp_path / "worker-home").mkdir()
    worker = Worker(live_server, tmp_path, "bisect-torch", "--concurrency", "2", cwd=tmp_path / "worker-home")
    try:
        got = run_cli_in_process("bisect", shas[0], shas[-1], "--budget-minutes", "20", "--poll", "0.3",
                                 "--", "study.yaml", env=env, cwd=folder)
    finally:
        worker.stop()
    out, err = got.stdout, got.stderr
    assert got.returncode == 0, (out, err, worker.log())
    at = shas[BREAK][:10]
    assert f"first commit where repeatability changed: {at} add dropout after fc1" in out, out
    study = re.search(rf"at {at}: +bad: .*\(study (\d+), 2 runs\)", out)
    assert study, out
    # the op, in the localization's own words, with the pair and the job that named it
    named = re.search(rf"\n  first divergent op at {at}: `aten::bernoulli_` in `Net\.drop` \(forward\) at "
                      r"train\.py:16, step 0, inputs identical → the op itself \(runs (\d+) and (\d+), localization "
                      r"job (\d+) on worker \S+\)\n", out)
    assert named, out
    assert "repeats part at step 0 (strict)\n" in out and "steady localize" not in out, out
    # progress while a worker replays: the job's request, then its states
    assert re.search(rf"localizing the first divergent op at {at}: runs \d+ and \d+ of study {study.group(1)}, by a "
                     rf"worker \(localization job {named.group(3)}, waiting up to 1\d\.\d minutes\)", err), err
    assert f"localization job {named.group(3)}: runs {named.group(1)} and {named.group(2)}: first divergent op:" in err
    with live_server.client() as c:  # kept with the study's verdict, as `steady localize` keeps it
        (kept,) = c.get(f"/api/v1/studies/{study.group(1)}/localizations").json()["items"]
        assert kept["answer"]["op"] == "aten::bernoulli_" and kept["answer"]["module"] == "Net.drop", kept
        page = c.get(f"/bisects/{shas[0][:7]}..{shas[-1][:7]}")
        assert page.status_code == 200
        assert (f"data-bisect-localization>runs {named.group(1)} and {named.group(2)}: first divergent op: "
                "`aten::bernoulli_` in `Net.drop` (forward)") in page.text, page.text


class _Api:
    """The server as the bisect's localization sees it: a job that stays ``status``, or a refusal."""

    def __init__(self, status: str = "pending", refuse: Exception | None = None) -> None:
        self.status, self.refuse, self.posts = status, refuse, []

    def _job(self) -> dict:
        return {"id": 7, "status": self.status, "run_ids": [31, 32], "step": 0, "attempt": 1, "worker_name": None,
                "error": "the replay driver gave no answer (exit 1)" if self.status == "failed" else None,
                "result": None}

    def post(self, path: str, json: dict | None = None) -> dict:
        self.posts.append(path)
        if self.refuse is not None and path.endswith("/localization-jobs"):
            raise self.refuse
        return self._job()

    def get(self, path: str) -> dict:
        return self._job()


def _bisect(api: _Api, budget_minutes: float | None) -> SimpleNamespace:
    seed = SimpleNamespace(verdict="differs", run_ids=[31, 32])
    report = SimpleNamespace(study=SimpleNamespace(id=5),
                             of_level=lambda level: [SimpleNamespace(per_seed=[seed])])
    return SimpleNamespace(api=api, reports={1: report}, commits=[None, SimpleNamespace(short="abcdef1234")],
                           args=argparse.Namespace(budget_minutes=budget_minutes, poll=0.01), started=0.0,
                           progress=lambda line: None)


def test_a_localization_not_done_in_time_is_cancelled_and_the_command_given(monkeypatch):
    from steady.server.cli import bisect

    now = [0.0]

    def clock() -> float:
        now[0] += 30.0  # every read of the clock is half a minute later
        return now[0]

    monkeypatch.setattr(bisect, "_clock", clock)
    api = _Api("running")
    line = bisect.localize(_bisect(api, 2.0), 1)
    assert line == ("no op named at abcdef1234: the localization did not finish within --budget-minutes 2 (runs 31 "
                    "and 32, localization job 7, running; cancelled); `steady localize 5` replays the pair on this "
                    "machine"), line
    assert api.posts[-1] == "/api/v1/localization-jobs/7/cancel"

    failed = bisect.localize(_bisect(_Api("failed"), None), 1)
    assert failed == ("no op named at abcdef1234: the localization failed: the replay driver gave no answer (exit 1) "
                      "(runs 31 and 32, localization job 7)"), failed

    from steady.server.cli.client import ApiError

    refused = _Api(refuse=ApiError(422, "body.runs: localization replays PyTorch (op by op) or Keras (layer by "
                                        "layer) training; runs 31 and 32 declare framework 'python'"))
    assert bisect.localize(_bisect(refused, None), 1) == (
        "no op named at abcdef1234: localization replays PyTorch (op by op) or Keras (layer by layer) training; runs "
        "31 and 32 declare framework 'python'")


@pytest.mark.parametrize("where", ["before", "between"])
def test_no_localize_is_an_option_before_good_or_between_bad_and_the_spec(where):
    from steady.server.cli.bisect import _split_target, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    argv = ["bisect", "--no-localize", "v1", "v2", "--", "study.yaml"] if where == "before" else \
        ["bisect", "v1", "v2", "--no-localize", "--", "study.yaml"]
    args = parser.parse_args(argv)
    assert _split_target(args) == ["study.yaml"] and args.no_localize is True
    plain = parser.parse_args(["bisect", "v1", "v2", "--", "study.yaml"])
    assert _split_target(plain) == ["study.yaml"] and plain.no_localize is False
