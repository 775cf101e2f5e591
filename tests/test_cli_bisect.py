"""`steady bisect` on a planted history, end to end: a user's git repository of 17 commits of a tiny training
script, against the live server with a real worker, and the bisect's dashboard page. One commit cannot run (skipped), one sums in another
order (the bits change, the repeats stay identical: not the bisected property), one adds an unseeded shuffle
(repeats differ): the bisect names that commit exactly, with its parent's and its own verdicts and studies.

The same history with a shift of the final loss instead of the shuffle is bisected by a TOST against GOOD's
code (found at its exact commit; with too small a budget, undecided between GOOD and BAD). Shifts only many
seeds see, and the wrong-commit rate, are simulated in process: tests/stats/test_bisect.py.
"""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_cli_in_process
from tests.gitfolder import commit_next, user_env
from tests.worker.test_worker_agent_e2e import Worker

TRAIN = """
    import argparse
    import random

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    seed = p.parse_args().seed
    LR = 0.05  # edit {edit}
    rng = random.Random(seed)
    data = [(x, 3.0 * x + rng.gauss(0.0, {noise})) for x in (rng.uniform(-1, 1) for _ in range(32))]
    order = list(range(len(data)))
    rng.shuffle(order)
    {shuffle}
    w = 0.0
    for step in range(4):
        for i in order:
            x, y = data[i]
            w -= LR * 2 * (w * x - y) * x
        terms = [(w * x - y) ** 2 for x, y in data]
        loss = {total} / len(terms)
        print(f"step {{step}} loss {{loss!r}}", flush=True)
"""

SPEC = """
    name: tiny-train
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

BROKEN, REORDER, BREAK, N_COMMITS = 8, 10, 11, 16


def _planted_history(root: Path, *, change: str = "shuffle", spec: str = SPEC) -> list[str]:
    """GOOD and 16 commits after it; returns their shas (index = point). From commit ``BREAK`` on, ``change``:
    ``shuffle`` adds an unseeded shuffle, ``noise`` draws the targets with more noise (the final loss shifts)."""
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / "study.yaml").write_text(textwrap.dedent(spec).lstrip())
    shas = []
    for i in range(N_COMMITS + 1):
        text = _train(i, change)
        if i == BROKEN:
            text = text.replace("w = 0.0", "w = 0.0 +")  # a syntax error, fixed by the next commit
        (root / "train.py").write_text(text)
        message = {0: "tiny training script", BROKEN: "half-finished edit", REORDER: "sum the loss in reverse",
                   BREAK: CHANGES[change]}.get(i, f"tune comment {i}")
        shas.append(commit_next(root, message))
    return shas


CHANGES = {"shuffle": "add a shuffle", "noise": "noisier targets"}
NOISE, MORE_NOISE = 0.1, 0.14


def _train(i: int, change: str = "shuffle") -> str:
    """train.py at commit ``i`` of the planted history."""
    shuffle = "random.Random().shuffle(order)  # a fresh order each run" if i >= BREAK and change == "shuffle" else ""
    noise = MORE_NOISE if i >= BREAK and change == "noise" else NOISE
    total = "sum(reversed(terms))" if i >= REORDER else "sum(terms)"
    return textwrap.dedent(TRAIN).lstrip().format(edit=i, shuffle=shuffle, total=total, noise=noise)


@pytest.mark.slow
def test_determinism_break_is_found_at_its_exact_commit(live_server, tmp_path):
    folder = tmp_path / "project"
    shas = _planted_history(folder)
    env = user_env(live_server, folder)
    (tmp_path / "worker-home").mkdir()
    worker = Worker(live_server, tmp_path, "bisect", "--concurrency", "2", cwd=tmp_path / "worker-home")
    try:
        got = run_cli_in_process("bisect", shas[0], shas[-1], "--budget-runs", "60", "--poll", "0.3",
                                 "--", "study.yaml", env=env, cwd=folder)
    finally:
        worker.stop()
    out, err = got.stdout, got.stderr
    assert got.returncode == 0, (out, err, worker.log())
    assert f"first commit where repeatability changed: {shas[BREAK][:10]} add a shuffle" in out, out
    assert re.search(r"train\.py \| +4 \+\+--\n +1 file changed", out), out  # its diff stat
    parent = re.search(rf"at its parent {shas[BREAK - 1][:10]}: good: .*\(study (\d+), 2 runs\)", out)
    at = re.search(rf"at {shas[BREAK][:10]}: +bad: .*\(study (\d+), 2 runs\)", out)
    assert parent and at, out
    # the first divergent op is asked for at once; a pure-Python script has no op a worker's replay hooks
    assert re.search(rf"  repeats part at step 0 \(strict\)\n  no op named at {shas[BREAK][:10]}: localization replays "
                     r"PyTorch \(op by op\) or Keras \(layer by layer\) training; runs \d+ and \d+ declare framework "
                     r"'python'\n", out), out
    # the broken commit was met and skipped, the sum-order commit judged good (its repeats are identical)
    assert re.search(rf"point {BROKEN} {shas[BROKEN][:10]}: skipped", err), err
    assert re.search(rf"point {REORDER} {shas[REORDER][:10]}: good", err), err
    assert "steady bisect" in out and ": found (exit 0)" in out

    # each point is an ordinary study of that commit's code, named for the bisect
    with live_server.client() as c:
        for sid, sha in ((parent.group(1), shas[BREAK - 1]), (at.group(1), shas[BREAK])):
            study = c.get(f"/api/v1/studies/{sid}").json()
            assert study["spec"]["code"]["git_commit"] == sha
            assert f"steady bisect {shas[0][:7]}..{shas[-1][:7]} (repeatability)" in study["spec"]["description"]
        report = c.get(f"/api/v1/studies/{at.group(1)}/report").json()
        assert report["outcome"]["status"] == "fail"
        # the bisect's page: its points in history order, the search's order, the answer
        span = f"{shas[0][:7]}..{shas[-1][:7]}"
        assert f"dashboard: {live_server.url}/bisects/{span}" in out
        page = c.get(f"/bisects/{span}")
        assert page.status_code == 200, page.text
        assert f"First commit where repeatability changed: <strong><code>{shas[BREAK][:10]}</code></strong>" in page.text
        assert ("data-bisect-localization>no op named: localization replays PyTorch (op by op) or Keras (layer by "
                "layer) training; this study&#39;s framework is &#39;python&#39;") in page.text, page.text
        points = [int(p) for p in re.findall(r'<tr data-point="(\d+)"', page.text)]
        assert points == [0, BROKEN, 9, REORDER, BREAK, 13, N_COMMITS], points
        assert re.search(rf'data-point="{BROKEN}".*?tone-none">skipped', page.text, re.S)
        assert c.get("/bisects/0000000..0000000").status_code == 404


TOST_SPEC = """
    name: tiny-train
    workload:
      framework: python
      command: ["python", "train.py", "--seed", "{seed}"]
    seeds: [0, 1, 2, 3]
    repeats: 1
    determinism: [seeded]
    threads: 1
    max_attempts: 1
    metrics: [{name: loss, margin: 0.004}]
"""


@pytest.mark.slow
def test_a_small_shift_of_the_final_loss_is_found_at_its_exact_commit(live_server, tmp_path):
    """`steady bisect --property tost` on the planted history whose commit 11 draws the targets with more noise,
    so the final loss moves up. The shift is larger than "small": about 3 SDs of the seed-to-seed spread (measured
    here over GOOD's seeds 0-39), so that 8 seeds per side decide it at the per-point level of 1% (5% over BAD and
    the 4 rounds) and the test stays cheap; one seed per side cannot test it, and 4 seeds per side leave it
    undecided (the second bisect). Each point is a two-arm study, GOOD's code against the point's, grown by 4
    seeds per arm up to 12 while the sequential TOST (margin 0.004, under 1.5 SDs) is inconclusive. The sum-order
    commit (10, the change's parent: new bits, the same distribution) is judged equivalent and not named; the
    commit that does not parse (8) is skipped. With a budget of 8 runs a point (4 seeds per arm) BAD itself stays
    undecided, and the answer is the whole range, with why."""
    import statistics

    folder = tmp_path / "project"
    shas = _planted_history(folder, change="noise", spec=TOST_SPEC)
    good = [_final_loss(_train(0, "noise"), seed) for seed in range(40)]
    changed = [_final_loss(_train(BREAK, "noise"), seed) for seed in range(40)]
    spread = statistics.stdev(good)
    assert 2.5 < (statistics.mean(changed) - statistics.mean(good)) / spread < 4.0
    assert 0.004 / spread < 1.5  # the margin, in seed SDs
    env = user_env(live_server, folder)
    (tmp_path / "worker-home").mkdir()
    worker = Worker(live_server, tmp_path, "bisect", "--concurrency", "4", cwd=tmp_path / "worker-home")
    try:
        got = run_cli_in_process("bisect", shas[0], shas[-1], "--property", "tost", "--budget-runs", "120",
                                 "--poll", "0.3", "--", "study.yaml", env=env, cwd=folder)
        with live_server.client() as c:  # the bisect's page, before the next bisect of the same range adds to it
            page = c.get(f"/bisects/{shas[0][:7]}..{shas[-1][:7]}").text
        small = run_cli_in_process("bisect", shas[0], shas[-1], "--property", "tost", "--budget-runs", "40",
                                   "--poll", "0.3", "--", "study.yaml", env=env, cwd=folder)
    finally:
        worker.stop()
    out, err = got.stdout, got.stderr
    assert got.returncode == 0, (out, err, worker.log())
    assert ("up to 24 runs per point; each point's claim at level 1% (5% over the 5 points the search decides when "
            "none is skipped or undecided)") in err, err
    assert f"first commit where tost changed: {shas[BREAK][:10]} noisier targets" in out, out
    assert re.search(r"train\.py \| +4 \+\+--\n +1 file changed", out), out
    parent = re.search(rf"at its parent {shas[REORDER][:10]}: good: equivalent: means differ by \S+, within ±0\.004 "
                       r"\(study (\d+), 16 runs\)", out)
    at = re.search(rf"at {shas[BREAK][:10]}: +bad: not equivalent: means differ by 0\.0\d+, outside ±0\.004 "
                   r"\(study (\d+), 16 runs\)", out)
    assert parent and at, out
    assert "repeats part" not in out and "localize" not in out
    # the sum-order commit is the change's parent, judged equivalent: not named; the broken commit skipped
    assert REORDER == BREAK - 1
    assert re.search(rf"point {BROKEN} {shas[BROKEN][:10]}: skipped \(study \d+, 8 runs\): 4 of its 8 runs failed, "
                     "leaving no tost check to judge", err), err
    judged = re.findall(r"^point (\d+) \w+: (good|bad|skipped) \(study \d+, (\d+) runs\)", err, re.M)
    assert judged == [("16", "bad", "16"), (str(BROKEN), "skipped", "8"), ("9", "good", "16"), ("13", "bad", "16"),
                      (str(BREAK), "bad", "16"), (str(REORDER), "good", "16")], err
    assert ("found (exit 0); 6 round(s), 88 runs; 5 point(s) decided, each point's claim wrong with probability ≤ 1%: "
            "the answer is wrong with probability ≤ 5% (Bonferroni)") in out, out
    with live_server.client() as c:  # each point: GOOD's code against the point's
        arms = c.get(f"/api/v1/studies/{at.group(1)}").json()["spec"]["arms"]
        assert [a["code"]["git_commit"] for a in arms] == [shas[0], shas[BREAK]]
    # the page reads the same: GOOD is the reference (no point of its own), the broken commit skipped
    assert f"First commit where tost changed: <strong><code>{shas[BREAK][:10]}</code></strong>" in page, page
    assert [int(p) for p in re.findall(r'<tr data-point="(\d+)"', page)] == [BROKEN, 9, REORDER, BREAK, 13, N_COMMITS]
    assert re.search(rf'data-point="{BROKEN}".*?tone-none">skipped.*?4 of its 8 runs failed, leaving no tost check',
                     page, re.S), page

    assert small.returncode == 2, (small.stdout, small.stderr)
    assert (f"undecided between {shas[0][:10]} (tiny training script) and {shas[-1][:10]} (tune comment 16): the "
            f"first change is one of the 16 commits after {shas[0][:10]}\n"
            f"  BAD {shas[-1][:10]} tune comment 16 is undecided: not yet equivalent: means differ by ") in small.stdout
    assert ("  an undecided point ran out of its share of the budget (8 runs of --budget-runs 40) before the check "
            "decided: raise --budget-runs\n") in small.stdout, small.stdout
    assert "undecided (exit 2); 1 round(s), 8 runs; 0 point(s) decided" in small.stdout


def _final_loss(script: str, seed: int) -> float:
    """The last loss ``script`` prints for ``seed``, run in this process."""
    import contextlib
    import io
    import sys

    saved, buf = sys.argv, io.StringIO()
    sys.argv = ["train.py", "--seed", str(seed)]
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile(script, "train.py", "exec"), {"__name__": "__main__"})
    finally:
        sys.argv = saved
    return float(buf.getvalue().split()[-1])


def _bisect_of(live_server, folder: Path, shas: list[str], spec: dict, prop: str, scratch: Path):
    """The CLI's bisect of ``folder`` for ``prop``, as `steady bisect` builds it (no study run)."""
    import argparse

    from steady.server.cli.bisect import _Bisect, history
    from steady.server.cli.client import Api
    from steady.server.stats.bisect import plan

    args = argparse.Namespace(property=prop, max_code_mb=50.0, poll=0.3, budget_runs=400, parallel=1, alpha=0.05)
    commits = history(str(folder), shas[0], shas[-1])
    assert [c.sha for c in commits] == shas
    b = _Bisect(Api(live_server.url, live_server.tokens["user"]), args, spec, str(folder), ".", commits,
                str(scratch))
    b.plan = plan(len(commits), budget_runs=400, alpha=0.05, judge_ends=1 if prop == "tost" else 2)
    return b


@pytest.mark.parametrize(("prop", "metrics"), [("seed-stability", [{"name": "loss", "max_std": 0.5}]),
                                               ("tost", [{"name": "loss", "margin": 0.1}])])
def test_each_point_of_a_staged_property_is_a_study_the_server_accepts(live_server, tmp_path, prop, metrics):
    import yaml

    folder = tmp_path / "project"
    shas = _planted_history(folder)
    spec = {**yaml.safe_load(textwrap.dedent(SPEC)), "seeds": [0, 1, 2, 3, 4], "repeats": 1, "metrics": metrics}
    b = _bisect_of(live_server, folder, shas, spec, prop, tmp_path / "scratch")
    point = BREAK
    body = b.study_spec(point, 40, b.code(point))
    with live_server.client() as c:
        got = c.post("/api/v1/studies", json=body)
        assert got.status_code == 201, got.text
        study = got.json()
        assert study["spec"]["budget"]["max_seeds"] == (20 if prop == "tost" else 40)
        # judged at 5% over the points the search decides: the ends (for tost only BAD) and one per round,
        # ⌈log2 16⌉ = 4 rounds over the 15 commits between GOOD and BAD
        assert study["spec"]["alpha"] == pytest.approx(0.05 / ((1 if prop == "tost" else 2) + 4))
        if prop == "tost":  # GOOD's code against the point's, GOOD the reference
            arms = study["spec"]["arms"]
            assert [a["code"]["git_commit"] for a in arms] == [shas[0], shas[point]]
            assert study["spec"]["reference_stack"] == arms[0]["name"]
        else:
            assert study["spec"]["code"]["git_commit"] == shas[point]
        c.post(f"/api/v1/studies/{study['id']}/cancel")
    # a commit without the spec's script is skipped before any study
    (folder / "train.py").unlink()
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qam", "drop it"],
                   cwd=folder, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, check=True, capture_output=True,
                          text=True).stdout.strip()
    b = _bisect_of(live_server, folder, [*shas, head], spec, prop, tmp_path / "scratch2")
    (skipped,) = b.judge((len(shas),), 40)
    assert skipped.state == "skipped" and skipped.runs == 0 and "train.py" in skipped.why


def test_usage_errors_and_a_budget_too_small_to_judge_the_ends(live_server, tmp_path):
    folder = tmp_path / "project"
    shas = _planted_history(folder)
    env = user_env(live_server, folder)

    def bisect(*args: str):
        return run_cli_in_process("bisect", *args, env=env, cwd=folder)

    got = bisect(shas[0], shas[-1], "--property", "tost", "--", "study.yaml")
    assert got.returncode == 3 and "--property tost needs a metric with a margin" in got.stderr, got.stderr
    got = bisect(shas[-1], shas[0], "--", "study.yaml")
    assert got.returncode == 3 and "is not a first-parent ancestor" in got.stderr, got.stderr
    got = bisect(shas[0], shas[-1])
    assert got.returncode == 3 and "give a study spec or a command after --" in got.stderr, got.stderr
    # 5 runs for the ends and 4 rounds: no point gets the 2 runs its first stage needs. Nothing runs; the
    # answer is the whole range, undecided, and why
    got = bisect(shas[0], shas[-1], "--budget-runs", "5", "--", "study.yaml")
    assert got.returncode == 2, (got.stdout, got.stderr)
    assert f"undecided between {shas[0][:10]} (tiny training script) and {shas[-1][:10]}" in got.stdout
    assert "the budget of 5 runs is spent (0 used): raise --budget-runs" in got.stdout
    got = bisect(shas[0], shas[-1], "--alpha", "0.6", "--", "study.yaml")
    assert got.returncode == 3 and "--alpha must be in (0, 0.5], got 0.6" in got.stderr, got.stderr


def test_the_stated_guarantee_is_the_plan(live_server, tmp_path):
    """A seed-stability bisect states its plan before it starts: each point at α / m for the m points the search
    decides (here the 2 ends and one per round, ⌈log2 16⌉ = 4 rounds), so a wrong commit ≤ α; with a budget too
    small for any point it decides none and says what that bound is."""
    import yaml

    from steady.server.cli.bisect import planned_guarantee
    from steady.server.stats.bisect import plan

    folder = tmp_path / "project"
    shas = _planted_history(folder)
    spec = {**yaml.safe_load(textwrap.dedent(SPEC)), "repeats": 1, "metrics": [{"name": "loss", "max_std": 0.5}]}
    (folder / "seeds.yaml").write_text(yaml.safe_dump(spec))
    p = plan(len(shas), budget_runs=5, alpha=0.02, judge_ends=2)
    assert (p.max_decided, p.alpha_point) == (2 + 4, pytest.approx(0.02 / 6))
    got = run_cli_in_process("bisect", shas[0], shas[-1], "--property", "seed-stability", "--alpha", "0.02",
                             "--budget-runs", "5", "--", "seeds.yaml", env=user_env(live_server, folder), cwd=folder)
    assert got.returncode == 2, (got.stdout, got.stderr)
    stated = ("each point's claim at level 0.333% (2% over the 6 points the search decides when none is skipped or "
              "undecided): wrong commit with probability ≤ 2%")
    assert planned_guarantee(p) == stated and stated in got.stderr, got.stderr
    assert ("0 point(s) decided, each point's claim wrong with probability ≤ 0.333%: the answer is wrong with "
            "probability ≤ 0% (Bonferroni)") in got.stdout, got.stdout


STACKS = ("env-a", "env-b", "env-c", "env-d", "env-e")


@pytest.mark.slow
def test_a_stack_range_is_bisected_over_the_spec_stacks(live_server, tmp_path):
    """GOOD and BAD name two of the spec's stacks: the stacks between them (in the spec's order) are the points,
    each a study of the working tree's code on that stack. Here every stack repeats: no change (exit 1)."""
    import yaml

    spec = {**yaml.safe_load(textwrap.dedent(SPEC)), "stacks": [{"name": n, "labels": ["bisect-env"]} for n in STACKS]}
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "study.yaml").write_text(yaml.safe_dump(spec))
    (folder / "train.py").write_text(_train(0))
    env = user_env(live_server, folder)
    (tmp_path / "worker-home").mkdir()
    worker = Worker(live_server, tmp_path, "bisect-env", "--labels", "bisect-env", cwd=tmp_path / "worker-home")
    try:
        got = run_cli_in_process("bisect", "env-a", "env-e", "--poll", "0.3", "--", "study.yaml", env=env, cwd=folder)
    finally:
        worker.stop()
    out, err = got.stdout, got.stderr
    assert got.returncode == 1, (out, err, worker.log())
    assert "bisecting 3 stacks between env-a and env-e" in err
    assert "no change to bisect: GOOD env-a is good: identical" in out and "BAD env-e is good: identical" in out, out
    with live_server.client() as c:
        listed = c.get("/api/v1/studies", params={"name": "(bisect env-a..env-e)", "limit": 10}).json()["items"]
        studies = [c.get(f"/api/v1/studies/{s['id']}").json() for s in listed]
        assert sorted(s["spec"]["stacks"][0]["name"] for s in studies) == ["env-a", "env-e"], studies
        assert all(s["spec"]["code"]["sha256"] == studies[0]["spec"]["code"]["sha256"] for s in studies)
        page = c.get("/bisects/env-a..env-e")
        assert page.status_code == 200 and "<th scope=\"col\">Stack</th>" in page.text, page.text

    # a TOST point on a stack: GOOD's stack is the reference of a two-stack study
    from steady.server.cli.bisect import _Bisect, stack_range
    from steady.server.cli.client import Api
    import argparse

    spec["metrics"] = [{"name": "loss", "margin": 0.1}]
    spec["code"] = studies[0]["spec"]["code"]
    from steady.server.stats.bisect import plan

    args = argparse.Namespace(property="tost", max_code_mb=50.0, poll=0.3, budget_runs=400)
    points = stack_range(spec, "env-b", "env-d")
    assert [p.sha for p in points] == ["env-b", "env-c", "env-d"]
    b = _Bisect(Api(live_server.url, live_server.tokens["user"]), args, spec, "", ".", points, str(tmp_path))
    b.plan = plan(len(points), budget_runs=400, judge_ends=1)
    with live_server.client() as c:
        made = c.post("/api/v1/studies", json=b.study_spec(2, 40, b.code(2)))
        assert made.status_code == 201, made.text
        body = made.json()["spec"]
        assert [s["name"] for s in body["stacks"]] == ["env-b", "env-d"] and body["reference_stack"] == "env-b"
        c.post(f"/api/v1/studies/{made.json()['id']}/cancel")
