"""The subprocess runner: failures are reported with the stderr tail, time limits and kills
reach the whole process group, user code logs through the SDK."""

from __future__ import annotations

import textwrap
import time

import pytest

from tests.conftest import alive, wait_until
from steady.worker.agent.local import run_local

pytestmark = pytest.mark.slow


def spec(entrypoint: str, **overrides) -> dict:
    # framework python: the user code here imports no framework (under torch each run would import torch)
    base = {"framework": "python", "entrypoint": entrypoint, "seed": 3, "determinism": "seeded", "time_limit_s": 60}
    base.update(overrides)
    return base


def script(tmp_path, body: str, name: str = "train.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_user_function_logs_through_the_sdk(tmp_path, monkeypatch):
    (tmp_path / "usercode.py").write_text(textwrap.dedent("""
        import random
        from steady import sdk

        def train(ctx):
            assert ctx.seed == 3 and ctx.determinism == "seeded" and ctx.params == {"n": 5}
            for step in range(ctx.params["n"]):
                sdk.log(step=step, loss=random.random(), acc=step / 10)
            sdk.set_digest("final_weights", sdk.digest_model({"w": [1.0, 2.0]}))
            return {"extra": 1.5}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    a = run_local(spec("usercode:train", params={"n": 5}))
    b = run_local(spec("usercode:train", params={"n": 5}))
    assert a.ok, a.stderr_tail
    assert a.series["loss"][0] == [0, 1, 2, 3, 4]
    assert a.series["loss"] == b.series["loss"]  # random.seed applied at seeded
    assert len(a.series["step_time"][0]) == 4  # automatic step time between log calls
    assert a.final_metrics == {"loss": a.values("loss")[-1], "acc": 0.4, "extra": 1.5}
    assert a.digests["final_weights"] and a.determinism_applied["python_random_seeded"]


def test_exception_in_user_script_fails_with_traceback(tmp_path):
    path = script(tmp_path, """
        from steady import sdk
        sdk.log(step=0, loss=1.0)
        print("about to fail")
        def inner():
            raise ValueError("bad batch shape")
        inner()
    """)
    r = run_local(spec(path))
    assert not r.ok and r.failure_kind == "error"
    assert r.error == "ValueError: bad batch shape"
    assert "Traceback" in r.stderr_tail and "in inner" in r.stderr_tail and "about to fail" in r.stderr_tail
    assert r.series["loss"] == ([0], [1.0])  # what was logged before the failure is kept


def test_crash_by_signal_is_a_crash(tmp_path):
    path = script(tmp_path, """
        import os, signal
        from steady import sdk
        sdk.log(step=0, loss=1.0)
        os.kill(os.getpid(), signal.SIGSEGV)
    """)
    r = run_local(spec(path))
    assert not r.ok and r.failure_kind == "crash" and "SIGSEGV" in r.error
    assert r.series["loss"] == ([0], [1.0])


def test_time_limit_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "pids"
    path = script(tmp_path, f"""
        import os, subprocess, sys, time
        from steady import sdk
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pidfile)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        for step in range(1000):
            sdk.log(step=step, loss=float(step))
            time.sleep(0.05)
    """)
    t0 = time.monotonic()
    r = run_local(spec(path, time_limit_s=12))
    assert time.monotonic() - t0 < 30
    assert not r.ok and r.failure_kind == "timeout" and "time limit" in r.error
    assert 5 <= len(r.values("loss")) < 1000
    pids = [int(p) for p in pidfile.read_text().split()]
    wait_until(lambda: not any(alive(p) for p in pids), 5, interval=0.05,
               what="the run and its grandchild to end (the grandchild survived the kill)")


def test_unknown_workload_and_wrong_framework_fail_cleanly():
    r = run_local({"framework": "torch", "workload": "nope", "seed": 0, "determinism": "none"})
    assert not r.ok and r.failure_kind == "error" and "unknown workload" in r.error
    r = run_local({"framework": "tensorflow", "workload": "torch_mlp", "seed": 0, "determinism": "none"})
    assert not r.ok and "runs on" in r.error
