"""The driver of a multi-process run: ``python -m steady.worker.inrun.distributed``, started by the agent in
place of the code when the run spec has ``distributed`` (or its command starts with ``torchrun``).

It plays ``torchrun --standalone`` on one node: it picks a free port of 127.0.0.1 and starts ``nproc`` copies
of the code (the command, or the harness for a built-in workload or an entrypoint), each with the rank
environment of :func:`steady.worker.contract.distributed.rank_env`. The ranks stay in the run's process
group (the agent's kill and the run's subreaper reach them) and die with the driver (``PR_SET_PDEATHSIG``).
Rank 0 is the run: its output goes to the run's output and its events are the run's; rank ``k``'s go to
``<run_dir>/ranks/rank-k.log`` and ``rank-k.events.jsonl``. When a rank fails, the driver ends the others
(a collective would otherwise wait for the dead rank until its timeout). When all have exited it writes the
run's ``distributed`` digest (:func:`steady.worker.contract.distributed.summarize`) and exits with rank 0's
status, else the first failing rank's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

from steady.worker.contract import distributed as contract
from steady.worker.contract.events import EVENTS_ENV, EventWriter

GRACE_S = 5.0  # after a rank failed: SIGTERM to the others, SIGKILL after this
POLL_S = 0.05


def _load_libc() -> Any:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True)
    except (ImportError, OSError):
        return None


_LIBC = _load_libc() if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    try:
        if _LIBC is not None:
            _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _reported(path: str) -> dict[str, Any]:
    """What a rank's event file says about the rank: its fingerprint and its digests (metrics skipped)."""
    out: dict[str, Any] = {"fingerprint": None, "digests": {}}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith('{"e":"m"'):
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                if event.get("e") == "fingerprint":
                    out["fingerprint"] = event.get("value")
                elif event.get("e") == "digest" and event.get("kind") != "data_order":
                    out["digests"][str(event.get("kind"))] = event.get("value")
    except OSError:
        pass
    return out


def _end(procs: list[subprocess.Popen], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass


def launch(plan: dict[str, Any], base_env: dict[str, str]) -> tuple[list[int], int | None]:
    """Start the ranks, wait for them all (ending the rest once one failed): their exit statuses, and the
    rank that failed first (None: none failed)."""
    nproc, run_dir = int(plan["nproc"]), plan["run_dir"]
    os.makedirs(os.path.join(run_dir, contract.RANKS_DIR), exist_ok=True)
    port, run_id = contract.free_port(), uuid.uuid4().hex[:12]
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        for rank in range(nproc):
            env = {k: v for k, v in base_env.items() if k != contract.PLAN_ENV}
            env.update(contract.rank_env(rank, nproc, port, plan.get("backend") or "gloo", run_id))
            if plan.get("shim_env"):  # a command: each rank's interpreter sets itself up (worker/inrun/shim)
                env[plan["shim_env"]] = "1"
            out = None
            if rank:
                env[EVENTS_ENV] = contract.rank_events(run_dir, rank)
                out = open(contract.rank_log(run_dir, rank), "wb")  # noqa: SIM115 - closed below
                logs.append(out)
            procs.append(subprocess.Popen(plan["argv"], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT if out else None,
                                          preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None))
        failed_at, first = None, None
        while any(p.poll() is None for p in procs):
            if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
                failed_at = time.monotonic()
                first = next(i for i, p in enumerate(procs) if p.poll() not in (None, 0))
                _end(procs, signal.SIGTERM)
            elif failed_at is not None and time.monotonic() - failed_at > GRACE_S:
                _end(procs, signal.SIGKILL)
            time.sleep(POLL_S)
        codes = [int(p.returncode) for p in procs]
        if first is None:
            first = next((i for i, c in enumerate(codes) if c != 0), None)
        return codes, first
    finally:
        _end(procs, signal.SIGKILL)
        for p in procs:
            try:
                p.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        for f in logs:
            f.close()


def run(plan: dict[str, Any], base_env: dict[str, str]) -> int:
    codes, first = launch(plan, base_env)
    ranks = []
    for rank, rc in enumerate(codes):
        events = base_env[EVENTS_ENV] if rank == 0 else contract.rank_events(plan["run_dir"], rank)
        ranks.append({"rank": rank, "rc": rc, **_reported(events)})
    record = contract.summarize(int(plan["nproc"]), plan.get("backend") or "gloo", ranks)
    writer = EventWriter(base_env[EVENTS_ENV])
    writer.write({"e": "digest", "kind": "distributed", "value": record})
    writer.close()
    if first is not None:
        print(f"[steady] rank {first} of {len(codes)} exited with status {codes[first]}; the driver ended the "
              f"other ranks (their output: {contract.RANKS_DIR}/rank-N.log in the run's directory)", file=sys.stderr)
        return codes[first]
    return 0


def main() -> int:
    plan = json.loads(os.environ[contract.PLAN_ENV])
    rc = run(plan, dict(os.environ))
    if rc < 0:  # a rank died of a signal: so does the driver, so the agent reads the same outcome
        sys.stdout.flush()
        os.kill(os.getpid(), -rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
