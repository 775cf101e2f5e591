"""A protocol-level stand-in for ``steady worker``: leases runs and streams synthetic metrics.

It speaks the wire contract with plain httpx and retries like the real agent (connection
errors, timeouts and 5xx/429 are retried with backoff until a deadline; 409 "lease lost"
abandons the run), so the scale tests can kill, stall and restart things around it without
training anything. Run it as a process:

    python -m tests.scale.fakeworker --server URL --token TOKEN --steps 200 --batch 20

Each run logs ``loss`` at steps 0..steps-1 with value ``run_id + step / 1000`` so a test can
check the stored series exactly.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass, field

import httpx

from steady.worker.agent.client import new_request_id
from steady.worker.contract.protocol import Series

RETRYABLE = {429, 500, 502, 503, 504}


class LeaseLost(Exception):
    pass


@dataclass
class Stats:
    completed: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    retries: int = 0
    statuses: dict[int, int] = field(default_factory=dict)  # every HTTP status seen, counted


def expected_values(run_id: int, steps: range) -> list[float]:
    return [run_id + s / 1000 for s in steps]


class FakeWorker:
    def __init__(self, server: str, token: str, name: str, *, deadline_s: float = 60.0, timeout: float = 10.0) -> None:
        self.client = httpx.Client(base_url=server, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)
        self.name = name
        self.deadline = time.monotonic() + deadline_s
        self.stats = Stats()
        self.worker_id: int | None = None

    def call(self, path: str, body: dict) -> httpx.Response:
        """POST with retries until the deadline; returns the first non-retryable answer."""
        delay = 0.05
        while True:
            try:
                r = self.client.post(path, json=body)
                self.stats.statuses[r.status_code] = self.stats.statuses.get(r.status_code, 0) + 1
                if r.status_code not in RETRYABLE:
                    return r
            except httpx.TransportError:
                pass
            if time.monotonic() + delay > self.deadline:
                raise TimeoutError(f"{path}: server unavailable until the deadline")
            self.stats.retries += 1
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)

    def register(self, labels: tuple[str, ...] = ("torch", "cpu")) -> int:
        r = self.call("/api/v1/workers/register", {"name": self.name, "labels": list(labels)})
        r.raise_for_status()
        self.worker_id = r.json()["worker_id"]
        return self.worker_id

    def lease(self) -> dict | None:
        # One request_id per lease, kept through the retries, as the agent does: when the API dies
        # after committing a lease but before answering, the retry gets that lease back rather than
        # a second run (which left another worker of a full study with nothing to lease).
        body = {"worker_id": self.worker_id, "request_id": new_request_id()}
        r = self.call(f"/api/v1/workers/{self.worker_id}/lease", body)
        if r.status_code == 204:
            return None
        r.raise_for_status()
        return r.json()

    def complete(self, run_id: int, body: dict) -> httpx.Response:
        """Complete the run, with a request_id kept through the retries: a completion the API applied but
        did not answer before it died is acknowledged again, not refused as a lost lease."""
        return self.call(f"/api/v1/runs/{run_id}/complete", {**body, "request_id": new_request_id()})

    def _checked(self, r: httpx.Response) -> dict:
        if r.status_code == 409:
            raise LeaseLost(r.json()["detail"][0]["msg"])
        r.raise_for_status()
        return r.json()

    def run(self, lease: dict, *, steps: int, batch: int, pause: float = 0.0) -> None:
        run_id, lid = lease["run_id"], lease["lease_id"]
        try:
            for seq, start in enumerate(range(0, steps, batch)):
                chunk = range(start, min(start + batch, steps))
                series = Series.packed("loss", list(chunk), expected_values(run_id, chunk))
                body = {"lease_id": lid, "seq": seq, "series": [series.model_dump(exclude_none=True)]}
                self._checked(self.call(f"/api/v1/runs/{run_id}/metrics", body))
                self._checked(self.call(f"/api/v1/runs/{run_id}/heartbeat", {"lease_id": lid, "step": chunk[-1]}))
                if pause:
                    time.sleep(pause)
            final = {"loss": expected_values(run_id, range(steps - 1, steps))[0]}
            self._checked(self.complete(run_id, {"lease_id": lid, "final_metrics": final}))
            self.stats.completed.append(run_id)
        except LeaseLost:
            self.stats.lost.append(run_id)

    def work(self, *, steps: int, batch: int, pause: float = 0.0, max_runs: int = 10**9, idle_exit_s: float = 3.0) -> Stats:
        """Lease and run until max_runs, the deadline, or nothing was queued for idle_exit_s."""
        idle_since = None
        done = 0
        while done < max_runs and time.monotonic() < self.deadline:
            leased = self.lease()
            if leased is None:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > idle_exit_s:
                    break
                time.sleep(0.1)
                continue
            idle_since = None
            self.run(leased, steps=steps, batch=batch, pause=pause)
            done += 1
        return self.stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--name", default="fake")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--pause", type=float, default=0.0, help="seconds between batches")
    p.add_argument("--max-runs", type=int, default=10**9)
    p.add_argument("--deadline", type=float, default=60.0)
    p.add_argument("--idle-exit", type=float, default=3.0)
    p.add_argument("--lease-only", action="store_true", help="lease --max-runs runs without running them")
    p.add_argument("--start-at", type=float, default=0.0, help="time.time() at which to start leasing")
    args = p.parse_args(argv)
    w = FakeWorker(args.server, args.token, args.name, deadline_s=args.deadline)
    w.register()
    print(json.dumps({"event": "registered", "worker_id": w.worker_id}), flush=True)
    if args.lease_only:
        time.sleep(max(0.0, args.start_at - time.time()))
        leased = []
        for _ in range(args.max_runs):
            got = w.lease()
            leased.append(None if got is None else got["run_id"])
        print(json.dumps({"event": "leased", "runs": leased}), flush=True)
        return 0
    stats = w.work(steps=args.steps, batch=args.batch, pause=args.pause, max_runs=args.max_runs, idle_exit_s=args.idle_exit)
    print(json.dumps({"event": "done", "completed": stats.completed, "lost": stats.lost, "retries": stats.retries,
                      "statuses": stats.statuses}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
