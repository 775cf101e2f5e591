"""Retries are safe: a proxy in front of a real ``steady serve`` drops answers after the server
processed the request, and the real worker client retries through it (issue #13).

Over 400 dropped answers on each backend (the same retry code; only the leasing SQL differs): every
lease the worker asked for is granted once (no second run leased by a retry, no orphaned lease left
running), no run uses an extra attempt, and no retried ``complete``/``fail``/``release`` is mistaken
for a lost lease.

Why 400: one client sends one request at a time, so each dropped answer takes the retry of that one
request, and a retry that leases a second run, spends an attempt or reads as a lost lease fails the
test at its first occurrence. At a drop rate of one half, 400 drops are about 100 dropped lease
answers and 90 dropped completions, with fails and releases among them (asserted), about half of
them answers to a retry (a retry dropped in its turn); more drops repeat the same paths (1,000 on PostgreSQL
cost 2.5 times the CPU).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.scale.conftest import all_runs, create_study
from steady.worker.agent.client import NonRetryableError, SteadyClient
from steady.worker.contract.protocol import (
    Heartbeat,
    MetricBatch,
    RunFailure,
    RunRelease,
    RunResult,
    Series,
    WorkerRegistration,
)

pytestmark = pytest.mark.slow

DROPS_WANTED = {"postgres": 400, "sqlite": 400}  # the answers to drop, per backend
DROP_RATE = 0.5


class AnswerDroppingProxy:
    """Forwards each HTTP request to ``upstream``; for a fraction of them, once the server has
    answered, closes the client's connection instead of passing the answer on."""

    def __init__(self, upstream: str, drop_rate: float, seed: int) -> None:
        self.rng = random.Random(seed)
        self.drop_rate = drop_rate
        self.lock = threading.Lock()
        self.dropped: Counter[str] = Counter()
        self.forwarded = 0
        self.upstream = httpx.Client(base_url=upstream, timeout=30)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")}
                answer = proxy.upstream.request(self.command, self.path, content=body, headers=headers)
                with proxy.lock:
                    proxy.forwarded += 1
                    drop = proxy.rng.random() < proxy.drop_rate
                    if drop:
                        proxy.dropped[self.path.rsplit("/", 1)[-1]] += 1
                if drop:  # the server did the work; the client never hears of it
                    self.close_connection = True
                    return
                self.send_response(answer.status_code)
                for k, v in answer.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> AnswerDroppingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.upstream.close()

    @property
    def total_dropped(self) -> int:
        with self.lock:
            return sum(self.dropped.values())


def test_retries_through_dropped_answers_lease_once_and_never_report_a_false_lease_loss(live_server_factory, backend_url):
    logging.getLogger("steady.worker.agent.client").setLevel(logging.ERROR)  # a warning per retry otherwise
    wanted = DROPS_WANTED["sqlite" if backend_url.startswith("sqlite") else "postgres"]
    server = live_server_factory(backend_url, lease_seconds=600, heartbeat_seconds=60, reaper_interval_seconds=1)
    study_id = create_study(server, runs=600)
    rng = random.Random(7)
    leases: Counter[int] = Counter()  # run -> leases the client received
    releases: Counter[int] = Counter()  # run -> releases acknowledged
    lease_ids: set[str] = set()
    outcomes: Counter[str] = Counter()
    errors: list[str] = []
    started = time.monotonic()
    with AnswerDroppingProxy(server.url, DROP_RATE, seed=13) as proxy:
        client = SteadyClient(proxy.url, server.tokens["worker"], retry_deadline_s=60, backoff_base_s=0.001, backoff_max_s=0.01)
        worker_id = client.register(WorkerRegistration(name="w-proxy", labels=["torch", "cpu"])).worker_id
        while proxy.total_dropped < wanted and time.monotonic() - started < 240:
            try:
                lease = client.lease(worker_id)
                assert lease is not None, "the queue ran dry before enough answers were dropped"
                assert lease.attempt == 1 and lease.lease_id not in lease_ids, lease
                leases[lease.run_id] += 1
                lease_ids.add(lease.lease_id)
                run_id, lid = lease.run_id, lease.lease_id
                client.heartbeat(run_id, Heartbeat(lease_id=lid, step=1))
                client.send_metrics(run_id, MetricBatch(lease_id=lid, seq=0, series=[Series.packed("loss", [0, 1], [1.0, 0.5])]))
                roll = rng.random()
                if roll < 0.7:
                    ack = client.complete(run_id, RunResult(lease_id=lid, final_metrics={"loss": 0.5}))
                    outcomes["completed"] += ack.status.value == "completed"
                elif roll < 0.85:
                    ack = client.fail(run_id, RunFailure(lease_id=lid, error="planted failure"))
                    outcomes["failed"] += ack.status.value == "failed"
                else:
                    ack = client.release(run_id, RunRelease(lease_id=lid))
                    outcomes["released"] += ack.status.value == "queued"
                    releases[run_id] += 1
            except NonRetryableError as exc:  # LeaseLostError and AlreadyFinishedError included
                errors.append(f"{type(exc).__name__}: {exc}")
                break
        client.close()
        dropped, forwarded = proxy.total_dropped, proxy.forwarded
        by_endpoint = dict(proxy.dropped)
    elapsed = time.monotonic() - started
    print(f"\n{dropped} answers dropped of {forwarded} requests in {elapsed:.1f} s: {by_endpoint}; outcomes {dict(outcomes)}")

    assert errors == [], errors  # no false "lease lost", no "already finished" for a retry
    assert dropped >= wanted, f"only {dropped} answers dropped in the time allowed"
    assert by_endpoint.get("lease", 0) > wanted // 10 and by_endpoint.get("complete", 0) > wanted // 10
    assert by_endpoint.get("fail", 0) and by_endpoint.get("release", 0), by_endpoint  # every finishing request retried
    with server.client("admin") as c:
        workers = c.get("/api/v1/workers").json()["items"]
        study = c.get(f"/api/v1/studies/{study_id}").json()
    assert [w["running_runs"] for w in workers] == [[]]  # no orphaned lease
    items = all_runs(server, study_id)
    by_status = Counter(r["status"] for r in items)
    assert by_status["running"] == 0
    assert by_status["completed"] == outcomes["completed"] and by_status["failed"] == outcomes["failed"]
    for r in items:  # no attempt spent by a retry: finished runs took one attempt, queued ones none
        assert r["attempt"] == (0 if r["status"] == "queued" else 1), r
        # each run was leased once per release plus once for the attempt that finished it: a
        # retried lease request never took a second run
        assert leases[r["id"]] == releases[r["id"]] + (r["status"] in ("completed", "failed")), r
    assert sum(leases.values()) == outcomes["completed"] + outcomes["failed"] + outcomes["released"]
    assert study["status"] in ("running", "queued")
