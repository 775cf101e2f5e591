"""Quarantine end to end: a quarantined worker leases no run of a study that respects quarantine (the default),
still leases runs of a study that opts out, and leases again once an admin lifts it; each change is in the
worker's history and delivered as an alert (JSON and Slack text) to a real webhook receiver; the Prometheus
gauge counts quarantined workers. A fleet check's result quarantines the worker it names when asked."""

from __future__ import annotations

import pytest

from steady.server.alerts import quarantine
from steady.server.models import Study, Worker
from tests.alerts.conftest import valid_signature
from tests.api.helpers import lease, register, spec


@pytest.fixture
def api(make_api):
    return make_api(allow_private_webhooks=True)


def _study(api, **overrides) -> int:
    r = api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["strict"], **overrides))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _worker(api, worker_id: int) -> dict:
    return next(w for w in api.get("/api/v1/workers").json()["items"] if w["id"] == worker_id)


def _gauge(api) -> float:
    text = api.get("/metrics").text
    line = next(ln for ln in text.splitlines() if ln.startswith("steady_workers_quarantined "))
    return float(line.split()[1])


def test_quarantine_keeps_respecting_studies_from_the_worker_until_released(api, receiver):
    hook = api.post("/api/v1/webhooks", role="admin", json={"url": receiver.url, "name": "ops"})
    assert hook.status_code == 201, hook.text
    secret = hook.json()["secret"]
    bad, good = register(api, "gpu-bad"), register(api, "gpu-good")
    r = api.post(f"/api/v1/workers/{bad}/quarantine", role="admin", json={"reason": "ECC errors on device 3"})
    assert r.status_code == 200, r.text
    assert r.json()["quarantine"]["reason"] == "ECC errors on device 3"
    assert r.json()["quarantine"]["by"] == "test-admin"
    assert _gauge(api) == 1.0

    respecting = _study(api, name="respects")
    assert lease(api, bad) is None  # a queued run it could take by its labels, refused by the quarantine
    opted_out = _study(api, name="may run on quarantined workers", respect_quarantine=False)
    got = lease(api, bad)
    assert got is not None and got["study_id"] == opted_out
    assert lease(api, good)["study_id"] == respecting  # the healthy worker takes the respecting study's run

    again = _study(api, name="respects too")
    assert lease(api, bad) is None
    released = api.post(f"/api/v1/workers/{bad}/release", role="admin", json={"reason": "card replaced"})
    assert released.status_code == 200, released.text
    assert released.json()["quarantine"] is None and released.json()["quarantine_lifted_by"] == "test-admin"
    assert lease(api, bad)["study_id"] == again
    assert _gauge(api) == 0.0

    history = api.get(f"/api/v1/workers/{bad}/history").json()["items"]
    assert [(e["kind"], e["actor"], e["reason"]) for e in history] == [
        ("released", "test-admin", "card replaced"), ("quarantined", "test-admin", "ECC errors on device 3")]

    firing, resolved = receiver.wait_for(2)
    assert valid_signature(firing, secret) and valid_signature(resolved, secret)
    assert (firing["json"]["event"], resolved["json"]["event"]) == ("firing", "resolved")
    assert firing["json"]["alert"]["kind"] == "worker_quarantine"
    assert firing["json"]["alert"]["group"] == {"worker": "gpu-bad", "worker_id": bad}
    text = firing["json"]["text"]
    assert text.startswith("[FIRING] critical: worker gpu-bad quarantined by test-admin: ECC errors on device 3")
    assert "None" not in text and f"/fleet#worker-{bad}" in text
    assert resolved["json"]["text"].startswith("[RESOLVED] critical: worker gpu-bad released from quarantine by "
                                               "test-admin: card replaced")


def test_only_an_admin_quarantines_and_bad_input_names_its_field(api):
    w = register(api, "w1")
    assert api.post(f"/api/v1/workers/{w}/quarantine", role="user", json={"reason": "x"}).status_code == 403
    assert api.post(f"/api/v1/workers/{w}/quarantine", role="worker", json={"reason": "x"}).status_code == 403
    assert api.post(f"/api/v1/workers/{w}/release", role="user", json={}).status_code == 403
    for body, field in (({}, "reason"), ({"reason": "   "}, "reason"), ({"reason": "x", "until": 3}, "until")):
        r = api.post(f"/api/v1/workers/{w}/quarantine", role="admin", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"][:2] == ["body", field]
    assert api.post("/api/v1/workers/999999/quarantine", role="admin", json={"reason": "x"}).status_code == 404
    r = api.post(f"/api/v1/workers/{w}/release", role="admin", json={})
    assert r.status_code == 409 and "is not quarantined" in r.text
    assert _worker(api, w)["quarantine"] is None


def test_a_fleet_check_quarantines_the_worker_it_names_when_asked(api):
    bad, good = register(api, "w-bad"), register(api, "w-good")
    sid = _study(api, name="fleet")
    with api.app.state.database.write() as session:
        study = session.get(Study, sid)
        checks = [quarantine.WorkerCheck(worker_id=bad, verdict="faulty", first_divergent_step=17,
                                         details={"repeats_parting": 3, "repeats": 3}),
                  quarantine.WorkerCheck(worker_id=good, verdict="agrees")]
        assert quarantine.apply_fleet_result(session, study, checks, base_url="http://x",
                                             quarantine_faulty=True) == [bad]
        # the same result applied again (a second completion hook, a retry) records nothing twice
        assert quarantine.apply_fleet_result(session, study, checks, base_url="http://x",
                                             quarantine_faulty=True) == []
    w = _worker(api, bad)["quarantine"]
    assert w["study_id"] == sid and "from step 17" in w["reason"]
    assert _worker(api, good)["quarantine"] is None
    events = api.get(f"/api/v1/workers/{bad}/history").json()["items"]
    assert [(e["kind"], e["study_id"], e["verdict"], e["first_divergent_step"]) for e in events] == [
        ("quarantined", sid, None, None), ("check", sid, "faulty", 17)]
    assert events[1]["details"] == {"repeats_parting": 3, "repeats": 3}
    assert [e["verdict"] for e in api.get(f"/api/v1/workers/{good}/history").json()["items"]] == ["agrees"]


def test_a_fleet_check_without_quarantine_only_records_results(api):
    bad = register(api, "w-bad")
    sid = _study(api, name="fleet")
    with api.app.state.database.write() as session:
        study = session.get(Study, sid)
        assert quarantine.apply_fleet_result(session, study, [quarantine.WorkerCheck(bad, "faulty", 4)],
                                             base_url="http://x") == []  # the spec has no fleet.quarantine
        assert session.get(Worker, bad).quarantined_at is None


@pytest.mark.parametrize("spec_fields, respects", [
    ({}, True), ({"respect_quarantine": False}, False), ({"fleet": {"workers": 4}}, False),
    ({"fleet": {"workers": 4}, "respect_quarantine": True}, True)])
def test_which_studies_respect_quarantine(spec_fields, respects):
    assert quarantine.respects(spec_fields) is respects


@pytest.mark.backends("sqlite")
def test_a_quarantined_worker_takes_no_localization_job_of_a_study_that_respects_quarantine(api):
    from tests.api.test_localization_jobs import _ask, _lease, _study

    sid, ids = _study(api)
    job = _ask(api, sid, (ids[0, 0], ids[0, 1])).json()
    bad, good = register(api, "w-bad"), register(api, "w-good")
    assert api.post(f"/api/v1/workers/{bad}/quarantine", role="admin", json={"reason": "bit flips"}).status_code == 200
    assert _lease(api, bad) is None  # its replay would localize the device's fault, not the study's
    assert _lease(api, good)["job_id"] == job["id"]
