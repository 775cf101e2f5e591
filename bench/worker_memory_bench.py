"""Worker memory benchmark: a real agent against a real ``steady serve`` that stalls mid-run.

A user entrypoint (``log_steps`` below) logs ``--steps`` steps through the SDK as fast as it
can (``loss`` plus the automatic ``step_time``). Once about half of them are logged, the whole
server process group is stopped (SIGSTOP) for ``--stall`` seconds, then resumed. Every
``--sample`` seconds the resident memory (RSS) of the agent and of the run subprocess is read
from /proc. Afterwards every point is read back through the API and checked: each step
exactly once, values bit for bit. Also measures the SDK's cost per ``log`` call in-process.

    .venv/bin/python bench/worker_memory_bench.py                       # 10 M steps, 30 s stall
    .venv/bin/python bench/worker_memory_bench.py --steps 200000 --stall 3

Writes bench/results/worker_memory.json. Target: agent and run-process RSS within 50 MB of
their level when the run starts logging, over the whole run; no point lost or duplicated.
"""

from __future__ import annotations

import argparse
import base64
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.common import REPO, Server, write_result

ENTRYPOINT = "bench.worker_memory_bench:log_steps"
TARGET_GROWTH_MB = 50.0


def loss_at(step: int) -> float:
    return (step % 1000) * 0.5  # exact in float64, so the check is bit for bit


def log_steps(ctx) -> dict:  # the workload: runs inside the run subprocess
    from steady import sdk

    steps = ctx.param("steps", 1000)
    log = sdk.log
    for step in range(steps):
        log(step=step, loss=(step % 1000) * 0.5)
    return {"logged_steps": float(steps)}


# --- measurements ---------------------------------------------------------------------------


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    out = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(task, encoding="ascii") as f:
                out.extend(int(x) for x in f.read().split())
        except OSError:
            pass
    return out


def sdk_log_cost(calls: int = 200_000) -> dict:
    """Cost of one ``sdk.log`` call (loss + the automatic step_time) writing a real event file.

    ``cpu_us``: CPU time of this thread (user + system, so the write syscall counts) per call,
    which other load on the machine does not inflate; ``median_us``: the median wall time of
    single calls (timer overhead included); ``mean_us``: wall time over all calls."""
    from array import array

    from steady import sdk

    saved = sdk._run
    with tempfile.TemporaryDirectory() as tmp:
        sdk._start(sdk.RunContext(seed=0, determinism="none", framework="torch"), os.path.join(tmp, "events.jsonl"))
        try:
            log, clock = sdk.log, time.perf_counter
            single = array("d", bytes(8 * calls))
            cpu, start = time.thread_time(), clock()
            for step in range(calls):
                t = clock()
                log(step=step, loss=step * 0.5)
                single[step] = clock() - t
            total, cpu = clock() - start, time.thread_time() - cpu
            t = clock()
            sdk._summary()
            summary_s = clock() - t
        finally:
            sdk._run.writer.close()
            sdk._run = saved
    ordered = sorted(single)
    return {"calls": calls, "cpu_us": cpu / calls * 1e6, "median_us": ordered[calls // 2] * 1e6,
            "p90_us": ordered[int(0.9 * calls)] * 1e6, "mean_us": total / calls * 1e6, "summary_s": summary_s}


def check_series(server: Server, run_id: int, key: str, first: int, n: int, expected) -> dict:
    """Read ``key`` back through the API: steps must be first..n-1, each once, values exact."""
    import numpy as np

    r = httpx.get(f"{server.url}/api/v1/runs/{run_id}/metrics/{key}", params={"format": "packed"},
                  headers={"Authorization": f"Bearer {server.tokens['user']}"}, timeout=600)
    r.raise_for_status()
    body = r.json()
    steps = np.frombuffer(base64.b64decode(body["steps_b64"]), "<i8")
    values = np.frombuffer(base64.b64decode(body["values_b64"]), "<f8")
    want = np.arange(first, n, dtype=np.int64)
    unique = np.unique(steps)
    out = {"points": len(steps), "expected": len(want), "duplicates": len(steps) - len(unique),
           "lost": len(np.setdiff1d(want, unique, assume_unique=True))}
    if expected is not None:
        order = np.argsort(steps, kind="stable")
        ok_steps = len(steps) == len(want) and np.array_equal(steps[order], want)
        out["values_exact"] = bool(ok_steps and np.array_equal(values[order].view("<i8"), expected(want).view("<i8")))
    return out


def run_bench(steps: int, stall_s: float, workdir: Path, *, sample_s: float = 0.5, stall_at: float = 0.5,
              timeout_s: float = 3600.0) -> dict:
    """Run one agent through one run of ``steps`` steps with the server stopped ``stall_s`` s."""
    import numpy as np

    workdir.mkdir(parents=True, exist_ok=True)
    with Server(f"sqlite:///{workdir / 'steady.db'}", workdir / "server", workers=1) as server:
        body = {"name": "worker-memory", "workload": {"framework": "torch", "entrypoint": ENTRYPOINT,
                                                      "params": {"steps": steps}},
                "seeds": [0], "repeats": 1, "determinism": ["none"], "metrics": [{"name": "loss"}],
                "max_attempts": 1, "time_limit_s": timeout_s}
        user = {"Authorization": f"Bearer {server.tokens['user']}"}
        r = httpx.post(server.url + "/api/v1/studies", json=body, headers=user, timeout=60)
        r.raise_for_status()
        study_id = r.json()["id"]
        agent_log = workdir / "agent.log"
        with open(agent_log, "wb") as log:
            agent = subprocess.Popen(
                [sys.executable, "-m", "steady.worker", "--server", server.url,
                 "--name", "memory-bench", "--work-dir", str(workdir / "agent"), "--max-runs", "1",
                 "--poll-max", "0.5", "--keep-run-dirs"],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(REPO), "STEADY_TOKEN": server.tokens["worker"]},  # the run imports bench.*
            )
        samples: list[tuple[float, float | None, float | None]] = []
        t0 = time.monotonic()
        stall_begin = stall_end = None
        logging_since = None  # when the run process had written its first metric line
        events_path = None
        half = steps * 70 * stall_at  # an event line (loss and step_time) takes about 70 bytes
        try:
            while agent.poll() is None:
                if time.monotonic() - t0 > timeout_s:
                    raise TimeoutError("the run did not finish in time")
                kids = children(agent.pid)
                run_rss = max((rss_mb(k) or 0.0 for k in kids), default=None) if kids else None
                now = time.monotonic() - t0
                samples.append((round(now, 2), rss_mb(agent.pid), run_rss))
                if events_path is None:
                    found = glob.glob(str(workdir / "agent" / "run-*" / "events.jsonl"))
                    events_path = found[0] if found else None
                size = os.path.getsize(events_path) if events_path and os.path.exists(events_path) else 0
                if logging_since is None and size > 4096:
                    logging_since = now
                if stall_begin is None and size >= half:
                    os.killpg(server.proc.pid, signal.SIGSTOP)
                    stall_begin = now
                if stall_begin is not None and stall_end is None and now - stall_begin >= stall_s:
                    os.killpg(server.proc.pid, signal.SIGCONT)
                    stall_end = now
                time.sleep(sample_s if stall_begin is None or stall_end is not None else min(sample_s, 0.2))
            if stall_end is None and stall_begin is not None:
                os.killpg(server.proc.pid, signal.SIGCONT)
                stall_end = time.monotonic() - t0
        finally:
            if agent.poll() is None:
                agent.kill()
            if stall_begin is not None and stall_end is None:
                os.killpg(server.proc.pid, signal.SIGCONT)
        wall = time.monotonic() - t0
        runs = httpx.get(f"{server.url}/api/v1/studies/{study_id}/runs", headers=user, timeout=60).json()["items"]
        run = runs[0]
        result = {"steps": steps, "stall_s": stall_s, "stall_began_s": stall_begin, "stall_ended_s": stall_end,
                  "logging_began_s": logging_since, "wall_s": round(wall, 1), "run_status": run["status"],
                  "run_error": run.get("error"), "agent_exit": agent.returncode,
                  "events_file_mb": round(os.path.getsize(events_path) / 2**20, 1) if events_path else None}
        if run["status"] == "completed":
            result["loss"] = check_series(server, run["id"], "loss", 0, steps,
                                          lambda s: (s % 1000).astype(np.float64) * 0.5)
            result["step_time"] = check_series(server, run["id"], "step_time", 1, steps, None)
            result["timings"] = httpx.get(f"{server.url}/api/v1/runs/{run['id']}", headers=user,
                                          timeout=60).json().get("timings")
        result["agent_log_tail"] = agent_log.read_text(errors="replace")[-1500:]
    result.update(_memory(samples, logging_since))
    lost_none = run["status"] == "completed" and all(
        result[k]["lost"] == 0 and result[k]["duplicates"] == 0 and result[k]["points"] == result[k]["expected"]
        for k in ("loss", "step_time")) and result["loss"].get("values_exact", False)
    result["no_point_lost_or_duplicated"] = lost_none
    result["target_met"] = bool(lost_none and result["agent_rss_mb"]["growth"] is not None
                                and result["agent_rss_mb"]["growth"] <= TARGET_GROWTH_MB
                                and result["run_rss_mb"]["growth"] is not None
                                and result["run_rss_mb"]["growth"] <= TARGET_GROWTH_MB)
    return result


def _memory(samples: list[tuple[float, float | None, float | None]], since: float | None) -> dict:
    """RSS at the first sample once the run logs, the peak after it and the growth, per process."""
    out = {}
    for name, i in (("agent_rss_mb", 1), ("run_rss_mb", 2)):
        after = [s[i] for s in samples if since is not None and s[0] >= since and s[i]]  # 0: exited
        start = after[0] if after else None
        peak = max(after) if after else None
        out[name] = {"start": start, "peak": peak, "end": after[-1] if after else None,
                     "growth": None if start is None else round(peak - start, 1)}
    step = max(1, len(samples) // 400)
    out["samples"] = {"t_s": [s[0] for s in samples[::step]], "agent_mb": [s[1] for s in samples[::step]],
                      "run_mb": [s[2] for s in samples[::step]]}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10_000_000)
    p.add_argument("--stall", type=float, default=30.0, help="seconds the server is stopped mid-run")
    p.add_argument("--sample", type=float, default=0.5, help="seconds between RSS samples")
    p.add_argument("--sdk-calls", type=int, default=200_000)
    a = p.parse_args()
    sdk = sdk_log_cost(a.sdk_calls)
    print(f"sdk.log: {sdk['cpu_us']:.2f} us CPU per call; wall median {sdk['median_us']:.2f} us, "
          f"mean {sdk['mean_us']:.2f} us")
    with tempfile.TemporaryDirectory(prefix="steady-worker-memory-") as tmp:
        result = run_bench(a.steps, a.stall, Path(tmp), sample_s=a.sample)
    result["sdk_log_us"] = sdk
    path = write_result("worker_memory", result)
    print(f"{a.steps:,} steps, server stopped {a.stall:g} s: run {result['run_status']} in {result['wall_s']} s; "
          f"agent RSS {result['agent_rss_mb']}; run RSS {result['run_rss_mb']}; "
          f"no point lost or duplicated: {result['no_point_lost_or_duplicated']}; target met: {result['target_met']}")
    print(f"wrote {path}")
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
