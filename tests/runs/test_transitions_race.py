"""Concurrent transitions of one run, each in its own write session and thread on the real
database (SQLite and PostgreSQL): exactly one wins, the others get 409 or the winner's ack,
and the run's row holds the winner's state only, never a mix of two transitions."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from tests.api.helpers import register, result, spec
from steady.worker.contract.protocol import RunAck, RunFailure, RunRelease, RunResult, RunStatus

RACES = 6


def _leased_runs(api, n: int) -> list[dict]:
    r = api.post("/api/v1/studies", json=spec(seeds=list(range(n)), repeats=1, determinism=["seeded"]))
    assert r.status_code == 201, r.text
    wid = register(api)
    leases = []
    for _ in range(n):
        got = api.post(f"/api/v1/workers/{wid}/lease", role="worker", json={"worker_id": wid})
        assert got.status_code == 200, got.text
        leases.append(got.json())
    return leases


def _holder(api):
    """The principal of the worker token that holds the leases."""
    from steady.server.kit.auth import Role
    from steady.server.kit.deps import Principal
    from steady.server.models import Worker

    with api.app.state.database.read() as session:
        token_id = session.scalars(select(Worker.token_id).distinct()).one()
    return Principal(token_id=token_id, name="worker", role=Role.worker)


def _race(api, *calls: Callable[[Any], Any]) -> list[Any]:
    """Run each call with its own write session in its own thread, all released at once; each
    outcome is the call's return value or the exception it raised (its transaction rolled back)."""
    barrier = threading.Barrier(len(calls))
    database = api.app.state.database

    def go(call: Callable[[Any], Any]) -> Any:
        try:
            with database.write() as session:
                barrier.wait(timeout=30)
                return call(session)
        except Exception as exc:  # noqa: BLE001 - the loser's 409 is an outcome, not a failure
            return exc

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(go, calls, timeout=120))


def _conflict_code(outcome: Any) -> str | None:
    from steady.server.kit.errors import Conflict

    return outcome.code if isinstance(outcome, Conflict) else None


def test_complete_racing_the_reaper_has_one_winner(make_api):
    """The worker completes just as the reaper (with a clock past the lease's expiry) re-queues
    the run: either the run is completed with the worker's result, or it is queued again with
    nothing of that result and the worker was told its lease is lost."""
    from steady.server.models import utcnow
    from steady.server.lifecycle import transitions
    from steady.server.lifecycle.leasing import reap_expired

    api = make_api(lease_seconds=60.0)
    leases = _leased_runs(api, RACES)
    principal = _holder(api)
    outcomes = []
    for lease in leases:
        body = RunResult.model_validate(result(lease["lease_id"], final_metrics={"loss": 0.25}))
        done, reaped = _race(
            api,
            lambda s, body=body, run_id=lease["run_id"]: transitions.complete(s, run_id, body, principal),
            lambda s: reap_expired(s, utcnow() + timedelta(seconds=120)),
        )
        run = api.get(f"/api/v1/runs/{lease['run_id']}").json()
        assert not isinstance(reaped, Exception), reaped
        if isinstance(done, RunAck):
            assert done.status is RunStatus.completed and not done.duplicate
            assert run["status"] == "completed" and run["final_metrics"] == {"loss": 0.25}
            assert run["worker_id"] is not None and run["attempt"] == 1  # the reaper changed nothing
        else:
            assert _conflict_code(done) == "lease_lost", done
            assert run["status"] == "queued" and run["final_metrics"] == {} and run["finished_at"] is None
            assert run["worker_id"] is None and run["lease_expires_at"] is None
        outcomes.append(run["status"])
    assert len(outcomes) == RACES


@pytest.mark.parametrize("rounds", [RACES])
def test_complete_fail_and_release_race_one_winner(make_api, rounds):
    """Three transitions of one lease (different request ids) at once: exactly one is applied."""
    from steady.server.lifecycle import transitions

    api = make_api()
    leases = _leased_runs(api, rounds)
    principal = _holder(api)
    for lease in leases:
        run_id, lid = lease["run_id"], lease["lease_id"]
        done = RunResult.model_validate(result(lid, request_id="req-complete-1"))
        failed = RunFailure(lease_id=lid, error="boom", request_id="req-fail-0001")
        released = RunRelease(lease_id=lid, request_id="req-release-1")
        outcomes = _race(
            api,
            lambda s, run_id=run_id, done=done: transitions.complete(s, run_id, done, principal),
            lambda s, run_id=run_id, failed=failed: transitions.fail(s, run_id, failed, principal),
            lambda s, run_id=run_id, released=released: transitions.release(s, run_id, released, principal),
        )
        winners = [o for o in outcomes if isinstance(o, RunAck)]
        assert len(winners) == 1, outcomes
        assert not winners[0].duplicate
        losers = [_conflict_code(o) for o in outcomes if not isinstance(o, RunAck)]
        # A transition that lost to complete or fail finds the run finished; one that lost to
        # release finds it queued under no lease.
        assert losers == ["already_finished"] * 2 or losers == ["lease_lost"] * 2, outcomes
        run = api.get(f"/api/v1/runs/{run_id}").json()
        assert run["status"] == winners[0].status.value
        expected = {"completed": ("req-complete-1", {"loss": 0.5}, None),
                    "failed": ("req-fail-0001", {}, "boom"),
                    "queued": ("req-release-1", {}, None)}[run["status"]]
        assert (run["final_metrics"], run["error"]) == expected[1:]
        assert run["attempt"] == (0 if run["status"] == "queued" else 1)


def test_a_retry_racing_its_original_gets_the_same_answer(make_api):
    """The same complete sent twice at once (a client retry after a timeout): one applies it,
    the other gets that acknowledgement back as a duplicate, not a 409."""
    from steady.server.lifecycle import transitions

    api = make_api()
    leases = _leased_runs(api, RACES)
    principal = _holder(api)
    for lease in leases:
        body = RunResult.model_validate(result(lease["lease_id"], request_id="req-complete-1"))
        first, second = _race(
            api,
            lambda s, run_id=lease["run_id"], body=body: transitions.complete(s, run_id, body, principal),
            lambda s, run_id=lease["run_id"], body=body: transitions.complete(s, run_id, body, principal),
        )
        assert isinstance(first, RunAck) and isinstance(second, RunAck), (first, second)
        assert sorted([first.duplicate, second.duplicate]) == [False, True]
        assert first.status == second.status == RunStatus.completed


def test_a_heartbeat_under_a_stale_lease_loses_to_the_new_holder(make_api):
    """Run leased by worker A, re-queued (A stopped heartbeating) and leased by worker B: A's late
    heartbeat, racing B's, is refused and leaves B's lease as B set it."""
    from steady.server.models import utcnow
    from steady.server.lifecycle import transitions
    from steady.server.lifecycle.leasing import reap_expired
    from steady.worker.contract.protocol import Heartbeat

    api = make_api(lease_seconds=60.0)
    (old,) = _leased_runs(api, 1)
    with api.app.state.database.write() as session:
        reap_expired(session, utcnow() + timedelta(seconds=120))
    wid_b = register(api, name="w2")
    new = api.post(f"/api/v1/workers/{wid_b}/lease", role="worker", json={"worker_id": wid_b}).json()
    assert new["run_id"] == old["run_id"] and new["lease_id"] != old["lease_id"] and new["attempt"] == 2
    principal = _holder(api)  # both workers registered with the same worker token
    stale, fresh = _race(
        api,
        lambda s: transitions.heartbeat(s, old["run_id"], Heartbeat(lease_id=old["lease_id"], step=1),
                                        api.app.state.settings, principal),
        lambda s: transitions.heartbeat(s, new["run_id"], Heartbeat(lease_id=new["lease_id"], step=7),
                                        api.app.state.settings, principal),
    )
    assert _conflict_code(stale) == "lease_lost", stale
    assert not isinstance(fresh, Exception), fresh
    run = api.get(f"/api/v1/runs/{new['run_id']}").json()
    assert run["progress_step"] == 7 and run["worker_id"] == wid_b and run["status"] == "running"


@pytest.mark.parametrize("transition", ["complete", "fail", "release", "heartbeat"])
def test_a_transition_checked_against_a_stale_read_changes_nothing(make_api, monkeypatch, transition):
    """The interleaving a race can produce, made deterministic: the transition reads the run while
    it is still leased, the reaper re-queues it before the transition writes. The write is the
    conditional UPDATE, so it matches no row: the caller gets 409 and the re-queued run keeps
    the reaper's state (a read-modify-write would have overwritten it)."""
    from steady.server.kit.errors import Conflict
    from steady.server.models import utcnow
    from steady.server.runs import repository as runs_repo
    from steady.server.lifecycle import transitions
    from steady.server.lifecycle.leasing import reap_expired
    from steady.worker.contract.protocol import Heartbeat

    api = make_api(lease_seconds=60.0)
    (lease,) = _leased_runs(api, 1)
    run_id, lid = lease["run_id"], lease["lease_id"]
    database = api.app.state.database
    with database.read() as session:
        stale = runs_repo.run_state(session, run_id)
    with database.write() as session:
        reap_expired(session, utcnow() + timedelta(seconds=120))
    reads = []
    real = runs_repo.run_state

    def first_read_stale(session, rid):
        reads.append(rid)
        return stale if len(reads) == 1 else real(session, rid)

    monkeypatch.setattr(runs_repo, "run_state", first_read_stale)
    principal = _holder(api)
    call = {
        "complete": lambda s: transitions.complete(s, run_id, RunResult.model_validate(result(lid)), principal),
        "fail": lambda s: transitions.fail(s, run_id, RunFailure(lease_id=lid, error="boom"), principal),
        "release": lambda s: transitions.release(s, run_id, RunRelease(lease_id=lid), principal),
        "heartbeat": lambda s: transitions.heartbeat(s, run_id, Heartbeat(lease_id=lid, step=5),
                                                     api.app.state.settings, principal),
    }[transition]
    with pytest.raises(Conflict) as lost, database.write() as session:
        call(session)
    # the stale read, then the re-read; a heartbeat writes first (one conditional UPDATE) and reads only
    # after it matched no row, to say why
    assert lost.value.code == "lease_lost" and len(reads) == (1 if transition == "heartbeat" else 2)
    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "queued" and run["attempt"] == 1 and run["lease_expires_at"] is None
    assert run["final_metrics"] == {} and run["error"] is None and run["progress_step"] is None
