"""The heartbeat loop that runs and localization jobs share: each beat's outcome, no server (a fake send)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

from steady.worker.agent.client import LeaseLostError, NonRetryableError, RetryableError
from steady.worker.agent.heartbeat import heartbeat_loop


def _events() -> dict[str, threading.Event]:
    return {"finished": threading.Event(), "cancel": threading.Event(), "lease_lost": threading.Event()}


def test_a_cancel_is_heard_a_failed_beat_retried_and_a_lost_lease_ends_the_loop(caplog):
    answers = [SimpleNamespace(cancel=False), SimpleNamespace(cancel=True), RetryableError("503"),
               NonRetryableError("422"), SimpleNamespace(cancel=True), LeaseLostError("409", 409)]
    deadlines: list[float] = []

    def send(deadline_s: float) -> SimpleNamespace:
        deadlines.append(deadline_s)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    ev = _events()
    with caplog.at_level(logging.INFO, logger="steady.worker"):
        heartbeat_loop(send, heartbeat_seconds=0.05, label="run 7", **ev)  # returns at the lost lease
    assert not answers and deadlines == [0.4] * 6  # at least 0.2 s between beats; each may take two intervals
    assert ev["cancel"].is_set() and ev["lease_lost"].is_set()
    said = [r.getMessage() for r in caplog.records]
    assert said.count("run 7: cancelled by the server") == 1  # heard once, not at every beat that repeats it
    assert "run 7: heartbeat failed: 503" in said and "run 7: heartbeat failed: 422" in said
    assert said[-1] == "run 7: lease lost (409); stopping it"


def test_a_finished_job_sends_no_beat():
    ev = _events()
    ev["finished"].set()
    sent: list[float] = []
    heartbeat_loop(sent.append, heartbeat_seconds=30, label="localization job 3", **ev)
    assert sent == [] and not ev["cancel"].is_set() and not ev["lease_lost"].is_set()
