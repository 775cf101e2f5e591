"""A lease, a release and a completion send a small, fixed number of SQL statements, however long the queue
and however many runs the workers hold: the lease's choice of run, its rules and its lock are one query
(``runs_repo.pick_queued``), a transition is one conditional UPDATE, and the study's status is derived from
index probes rather than a count of its runs. Statement counts are exact, unlike times."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from tests.api.helpers import lease, register, result, spec

# PostgreSQL and SQLite alike (transaction control, SQLite's BEGIN IMMEDIATE, not counted): the caller's
# worker, the reaper's check, the worker's row, the choice, the claim, the old attempt's points, the
# worker's last lease
LEASE_STATEMENTS = 7
# the conditional UPDATE, the attempt's points, the study row's lock, the probes of its runs' states
TRANSITION_STATEMENTS = 4


@contextmanager
def _statements() -> Iterator[list[tuple[Any, str]]]:
    """(connection, statement) of every statement sent meanwhile; the app's background loops send theirs on
    connections of their own."""
    sent: list[tuple[Any, str]] = []

    def count(conn, cursor, statement, parameters, context, executemany) -> None:
        if not statement.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK")):
            sent.append((conn, statement))

    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield sent
    finally:
        event.remove(Engine, "before_cursor_execute", count)


def _counted(call: Callable[[], Any], marker: str) -> tuple[Any, list[str]]:
    """What ``call`` returned, and the statements of the transaction that sent one containing ``marker``."""
    with _statements() as sent:
        out = call()
    conns = {id(c): c for c, statement in sent if marker in statement}
    assert len(conns) == 1, [s[:100] for _, s in sent]
    [conn] = conns.values()
    return out, [statement for c, statement in sent if c is conn]


def test_a_lease_and_a_transition_send_a_fixed_number_of_statements(api):
    # a queue longer than a lease's candidate page, and workers holding several runs each
    r = api.post("/api/v1/studies", json=spec(seeds=list(range(120)), repeats=1, determinism=["seeded", "strict"]))
    assert r.status_code == 201, r.text
    workers = [register(api, name=f"w{i}") for i in range(3)]
    first = lease(api, workers[0])  # the study's first lease moves it to running (and so locks the study row)
    assert first is not None
    held: list[dict] = [first]
    for _ in range(3):
        for wid in workers:
            leased, sent = _counted(lambda wid=wid: lease(api, wid), "lease_request_id")
            assert leased is not None
            assert len(sent) <= LEASE_STATEMENTS, "\n".join(s[:90] for s in sent)
            held.append(leased)
    assert len({h["run_id"] for h in held}) == len(held)  # every lease a different run

    gone, sent = _counted(lambda: api.post(f"/api/v1/runs/{held[1]['run_id']}/release", role="worker",
                                           json={"lease_id": held[1]["lease_id"], "request_id": "release-1"}),
                           "transition_request_id")
    assert gone.status_code == 200 and gone.json()["status"] == "queued", gone.text
    assert len(sent) <= TRANSITION_STATEMENTS, sent
    done, sent = _counted(lambda: api.post(f"/api/v1/runs/{held[2]['run_id']}/complete", role="worker",
                                           json=result(held[2]["lease_id"])), "transition_request_id")
    assert done.status_code == 200 and done.json()["status"] == "completed", done.text
    assert len(sent) <= TRANSITION_STATEMENTS, sent
    # a repeated release is answered from the run's state, once the UPDATE matched nothing
    again = api.post(f"/api/v1/runs/{held[1]['run_id']}/release", role="worker",
                     json={"lease_id": held[1]["lease_id"], "request_id": "release-1"})
    assert again.status_code == 200 and again.json()["duplicate"] is True, again.text
    runs = {r["id"]: r for r in api.get(f"/api/v1/studies/{first['study_id']}/runs", params={"limit": 500}).json()["items"]}
    assert runs[held[1]["run_id"]]["status"] == "queued" and runs[held[2]["run_id"]]["status"] == "completed"
    assert api.get(f"/api/v1/studies/{first['study_id']}").json()["status"] == "running"
