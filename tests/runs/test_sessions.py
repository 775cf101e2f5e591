"""Read and write sessions: services declare which one they need (so a type checker refuses a
read session passed to a write), and a read session refuses writes at run time as well."""

from __future__ import annotations

import inspect
import typing

import pytest
from sqlalchemy.orm import Session

from steady.server.kit.db import ReadOnlySessionError, ReadSession, WriteSession
from steady.server.lifecycle import ingest, leasing, service, transitions
from steady.server.runs import repository
from steady.server.studies import service as studies
from tests.api.helpers import register, result, spec
from steady.worker.contract.protocol import RunResult

WRITES = [
    transitions.heartbeat, transitions.complete, transitions.fail, transitions.release,
    leasing.lease_next, leasing.reap_expired,
    ingest.store, service.exclude_run, service.include_run,
    studies.create_study, studies.cancel_study, studies.refresh_status, studies.upload_external_run,
    repository.transition, repository.transition_held, repository.pick_queued, repository.claim_returning,
    repository.update_where, repository.insert_runs, repository.cancel_runs_of,
]
READS = [service.get_run, leasing.running_in_scope, repository.get_run, repository.find_run, repository.run_state,
         repository.list_runs, repository.status_counts, repository.batch_context, repository.judged_runs]


def _session_type(fn) -> object:
    return typing.get_type_hints(fn)["session"]


@pytest.mark.parametrize("fn", WRITES, ids=lambda f: f"{f.__module__}.{f.__name__}")
def test_what_changes_runs_takes_a_write_session(fn):
    assert _session_type(fn) is WriteSession


@pytest.mark.parametrize("fn", READS, ids=lambda f: f"{f.__module__}.{f.__name__}")
def test_queries_take_either_session(fn):
    assert _session_type(fn) is Session  # ReadSession and WriteSession are both Sessions


def test_every_repository_function_of_runs_declares_its_session():
    """Nothing in the runs repository takes a ReadSession only (a write path could not call it),
    and what is not listed as a write does not demand a write session."""
    for name, fn in inspect.getmembers(repository, inspect.isfunction):
        if fn.__module__ != repository.__name__ or "session" not in inspect.signature(fn).parameters:
            continue
        declared = _session_type(fn)
        assert declared is not ReadSession, name
        assert (declared is WriteSession) == (fn in WRITES), name


def test_a_read_session_refuses_a_transition(api):
    r = api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["seeded"]))
    assert r.status_code == 201, r.text
    wid = register(api)
    lease = api.post(f"/api/v1/workers/{wid}/lease", role="worker", json={"worker_id": wid}).json()
    from steady.server.kit.auth import Role
    from steady.server.kit.deps import Principal

    admin = Principal(token_id=0, name="admin", role=Role.admin)
    body = RunResult.model_validate(result(lease["lease_id"]))
    with pytest.raises(ReadOnlySessionError), api.app.state.database.read() as session:
        transitions.complete(session, lease["run_id"], body, admin)  # type: ignore[arg-type]  # the point
    assert api.get(f"/api/v1/runs/{lease['run_id']}").json()["status"] == "running"
    with api.app.state.database.write() as session:
        assert transitions.complete(session, lease["run_id"], body, admin).status.value == "completed"
