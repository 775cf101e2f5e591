"""A multi-process run is one run (steady.worker.inrun.distributed): the worker starts the ranks with the
environment torchrun sets, captures rank 0, keeps every rank's output and state, ends the ranks together
when one fails or the run is killed, and plays ``torchrun --nproc-per-node N`` commands itself.

Plain-Python ranks (``framework: python``) show the process side in seconds; real torch ranks (gloo on
CPU, 3 processes) show the per-rank record and the attribution."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from steady.worker.agent.local import run_local
from steady.worker.contract.distributed import rank_events, rank_log
from tests.conftest import alive, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and the subreaper are Linux's")

RANK_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    out, then = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                          "MASTER_ADDR", "MASTER_PORT", "STEADY_EVENTS_FILE")}
    env["pid"] = os.getpid()
    with open(os.path.join(out, f"rank-{rank}.json.tmp"), "w") as f:
        json.dump(env, f)
    os.rename(os.path.join(out, f"rank-{rank}.json.tmp"), os.path.join(out, f"rank-{rank}.json"))
    for step in range(3):
        print(f"step {step} loss {rank + step / 10!r}", flush=True)
    if then == "fail" and rank == 1:  # once every rank runs: the others must be ended, not merely never started
        world = int(os.environ["WORLD_SIZE"])
        while not all(os.path.exists(os.path.join(out, f"rank-{k}.json")) for k in range(world)):
            time.sleep(0.01)
        sys.exit(3)
    if then in ("fail", "hang"):
        time.sleep(600)
""")


def _ranks(folder, n):
    found = []
    for k in range(n):
        path = folder / f"rank-{k}.json"
        found.append(json.loads(path.read_text()) if path.exists() else None)
    return found


def _python_spec(tmp_path, command_head, then="exit", **extra):
    script, out = tmp_path / "ranks.py", tmp_path / "out"
    script.write_text(RANK_SCRIPT)
    out.mkdir(exist_ok=True)
    return {"framework": "python", "seed": 0, "repeat": 0, "determinism": "seeded", "time_limit_s": 60,
            "command": [*command_head, str(script), str(out), then], **extra}, out


@pytest.mark.parametrize("launch", ["spec", "torchrun"])
def test_ranks_get_torchruns_environment_and_rank_0_is_the_run(tmp_path, launch):
    if launch == "spec":
        spec, out = _python_spec(tmp_path, ["python"], distributed={"nproc": 3})
    else:
        spec, out = _python_spec(tmp_path, ["torchrun", "--standalone", "--nproc-per-node", "3"])
    run_dir = tmp_path / "run"
    r = run_local(spec, work_dir=str(run_dir), device="cpu")
    assert r.ok, (r.error, r.stderr_tail)
    ranks = _ranks(out, 3)
    assert [e["RANK"] for e in ranks] == ["0", "1", "2"] and {e["WORLD_SIZE"] for e in ranks} == {"3"}
    assert {e["LOCAL_WORLD_SIZE"] for e in ranks} == {"3"} and {e["MASTER_ADDR"] for e in ranks} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in ranks}) == 1 and int(ranks[0]["MASTER_PORT"]) != 29500
    # rank 0's output is the run's (captured); the others' are kept beside it, with their own events
    assert r.series["loss"] == ([0, 1, 2], [0.0, 0.1, 0.2])
    assert ranks[1]["STEADY_EVENTS_FILE"] == rank_events(str(run_dir), 1)
    assert "step 2 loss 1.2" in Path(rank_log(str(run_dir), 1)).read_text()
    assert r.fingerprint["distributed"] == {"world_size": 3, "backend": "gloo"}  # part of the stack
    record = r.digests["distributed"]
    assert record["world_size"] == 3 and [x["rank"] for x in record["ranks"]] == [0, 1, 2]
    assert all(x["rc"] == 0 and x["fingerprint"] for x in record["ranks"])


def test_a_failing_rank_ends_the_others_and_fails_the_run_naming_it(tmp_path):
    spec, out = _python_spec(tmp_path, ["python"], then="fail", distributed={"nproc": 3})
    r = run_local(spec, work_dir=str(tmp_path / "run"), device="cpu")
    pids = [e["pid"] for e in _ranks(out, 3)]
    try:
        assert not r.ok and r.failure_kind == "error" and "status 3" in r.error, (r.error, r.stderr_tail)
        assert "rank 1 of 3 exited with status 3" in r.stderr_tail
        wait_until(lambda: not any(alive(p) for p in pids), 10, interval=0.05, what="every rank to end")
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_killing_the_run_ends_every_rank(tmp_path):
    spec, out = _python_spec(tmp_path, ["python"], then="hang", distributed={"nproc": 3})
    pids: list[int] = []

    def kill_when_ranks_run(proc):
        wait_until(lambda: all(_ranks(out, 3)), 30, interval=0.05, what="three ranks to start")
        pids.extend(e["pid"] for e in _ranks(out, 3))
        proc.kill("cancelled")

    r = run_local(spec, work_dir=str(tmp_path / "run"), device="cpu", on_start=kill_when_ranks_run)
    try:
        assert not r.ok and r.failure_kind == "cancelled"
        wait_until(lambda: not any(alive(p) for p in pids), 10, interval=0.05, what="every rank to end with its run")
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def _torch_spec(plant, repeat, nproc=3, steps=6):
    return {"framework": "torch", "workload": "torch_distributed", "seed": 0, "repeat": repeat,
            "determinism": "seeded", "threads": 1, "time_limit_s": 300,
            "params": {"plant": plant, "steps": steps}, "distributed": {"nproc": nproc}}


@pytest.mark.slow
def test_three_torch_ranks_repeat_bitwise_and_record_each_ranks_state():
    runs = [run_local(_torch_spec("none", repeat), device="cpu") for repeat in (0, 1)]
    for r in runs:
        assert r.ok, (r.error, r.stderr_tail)
    a, b = runs
    assert a.series["loss"][0] == list(range(6))  # rank 0's metrics only: one value per step
    assert a.series["loss"][1] == b.series["loss"][1] and a.digests == b.digests
    record = a.digests["distributed"]
    assert len(record["ranks"]) == 3 and all(len(x["steps"]) == 6 for x in record["ranks"])
    # DDP keeps the replicas equal: the same layer order, named state and final weights on every rank,
    # while each rank computed gradients of its own share of the batch
    for field in ("model", "named_state", "named_final", "final_weights"):
        assert len({json.dumps(x[field]) for x in record["ranks"]}) == 1, field
    assert len({x["steps"][0][0] for x in record["ranks"]}) == 3
    assert len({x["steps"][0][1] for x in record["ranks"]}) == 1
    assert np.isfinite(a.series["loss"][1]).all()
