"""The resume check's driver: ``python -m steady.worker.inrun.resume``, started by the agent in place of the code.

It reads its plan from :data:`~steady.worker.contract.resume.PLAN_ENV` and starts the run's code (the
command, or the harness for an entrypoint) several times, each launch a child in its own process
group that the driver ends with it (DataLoader workers included):

1. the reference, uninterrupted: the run's own output, events, metrics and result; checkpoints in
   ``<run_dir>/checkpoints/reference``;
2. one launch per resume point ``k`` in ``at``: stopped after update ``k`` (SIGKILL, or SIGTERM then
   SIGKILL after a grace, in-process, just before update ``k + 1``: :mod:`steady.worker.inrun.resumestate`), then restarted with the same
   checkpoint folder (``<run_dir>/checkpoints/resumed``), through the code's own resume path; the last
   launch runs to the end. Their output goes to ``<run_dir>/resume/launch-N.log``, their events to
   files beside it (they are not the run's metrics).

Then :func:`steady.worker.contract.resume.judge` compares the state the launches recorded, and the
record is written to the run's events as its ``resume`` digest. The exit status is the reference's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from steady.worker.contract import placeholders
from steady.worker.contract import resume as contract
from steady.worker.contract.events import EVENTS_ENV, EventWriter

TAIL_CHARS = 2000


def _records(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TAIL_CHARS))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _final_metrics(events: str) -> dict[str, float]:
    """The SDK's final values from a launch's ``result`` event (empty when it logged none)."""
    result = next((e for e in reversed(_records(events)) if isinstance(e, dict) and e.get("e") == "result"), None)
    values = (result or {}).get("final_metrics") or {}
    return {str(k): float(v) for k, v in values.items() if isinstance(v, (int, float))}


def _launch(argv: list[str], env: dict[str, str], log: str | None) -> int:
    out = open(log, "wb") if log else None  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT if out else None,
                                start_new_session=True)
        try:
            rc = proc.wait()
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # what it left behind (loader workers)
            except (ProcessLookupError, PermissionError):
                pass
        return rc
    finally:
        if out is not None:
            out.close()


def run(plan: dict[str, Any], base_env: dict[str, str]) -> int:
    at = [int(k) for k in plan["at"]]
    run_dir = plan["run_dir"]
    folder = os.path.join(run_dir, "resume")
    os.makedirs(folder, exist_ok=True)

    def argv_for(checkpoints: str) -> list[str]:
        os.makedirs(checkpoints, exist_ok=True)
        if plan.get("command"):
            values = dict(plan["values"], checkpoint_dir=checkpoints)
            return placeholders.fill_command(plan["command"], values, plan["python"])
        return [plan["python"], "-m", "steady.worker.inrun.harness"]

    def env_for(checkpoints: str, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in base_env.items() if k != contract.PLAN_ENV}
        env[contract.CHECKPOINT_ENV] = checkpoints
        if plan.get("shim_env"):  # a command: each launch's interpreter sets itself up (worker/inrun/shim)
            env[plan["shim_env"]] = "1"
        if plan.get("micro_batches"):  # the stops and the digests fall between micro-batches
            env[contract.MICRO_ENV] = str(plan["micro_batches"])
        env.update(extra)
        return env

    reference_out = os.path.join(folder, "reference.jsonl")
    checkpoints = os.path.join(run_dir, "checkpoints", "reference")
    rc = _launch(argv_for(checkpoints), env_for(checkpoints, **{
        contract.ROLE_ENV: "reference", contract.AT_ENV: ",".join(map(str, at)), contract.OUT_ENV: reference_out,
    }), None)
    launches: list[dict[str, Any]] = []
    if rc == 0:
        checkpoints = os.path.join(run_dir, "checkpoints", "resumed")
        for i in range(len(at) + 1):
            out = os.path.join(folder, f"launch-{i + 1}.jsonl")
            log = os.path.join(folder, f"launch-{i + 1}.log")
            extra = {contract.OUT_ENV: out, EVENTS_ENV: os.path.join(folder, f"launch-{i + 1}.events.jsonl"),
                     contract.ROLE_ENV: "interrupted" if i < len(at) else "resumed"}
            if i < len(at):
                extra[contract.STOP_ENV] = str(at[i] - (at[i - 1] if i else 0))
                extra[contract.SIGNAL_ENV] = plan.get("signal") or "kill"
            if i:
                extra[contract.FROM_ENV] = str(at[i - 1])
            code = _launch(argv_for(checkpoints), env_for(checkpoints, **extra), log)
            launches.append({"rc": code, "records": _records(out), "tail": _tail(log)})
            if i < len(at) and not any("killed_after" in r for r in launches[-1]["records"]):
                break  # it was not stopped where it should have been: judge() says why
    record: dict[str, Any] = contract.judge(_records(reference_out), launches, at, plan.get("micro_batches")) if rc == 0 else {
        "at": at, "verdict": "failed", "missing": [], "points": [],
        "reason": f"the uninterrupted run failed (exit status {rc})"}
    record["determinism"] = plan.get("determinism")
    if launches:  # the values the code logged through the SDK, for a comparison against the seeds' spread
        record["final_metrics"] = {
            "reference": _final_metrics(base_env[EVENTS_ENV]),
            "resumed": _final_metrics(os.path.join(folder, f"launch-{len(launches)}.events.jsonl")),
        }
    record["launches"] = [{"rc": launch["rc"], "tail": launch["tail"][-500:]} for launch in launches]
    writer = EventWriter(base_env[EVENTS_ENV])
    writer.write({"e": "digest", "kind": "resume", "value": record})
    writer.close()
    return rc


def main() -> int:
    plan = json.loads(os.environ[contract.PLAN_ENV])
    rc = run(plan, dict(os.environ))
    if rc < 0:  # the reference died of a signal: so does the driver, so the agent reads the same outcome
        sys.stdout.flush()
        os.kill(os.getpid(), -rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
