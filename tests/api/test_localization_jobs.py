"""Localization jobs over the API: asked for by a study's owner (422 naming `runs` for a pair that is not two
replayable repeats, 409 while one is pending), leased by a worker like a run (one worker, a repeated request
gets the same job, heartbeats carry a cancel, an expired lease goes back once then fails), and the answer
kept exactly as `steady localize` keeps it."""

from __future__ import annotations

from datetime import timedelta

from tests.api.helpers import error_of, register, spec
from tests.conftest import BOTH_BACKENDS, POSTGRES_ONLY, SQLITE_ONLY, wait_until

pytestmark = SQLITE_ONLY

ANSWER = {"step": 2, "op": "aten::uniform_", "module": "Net.pool", "phase": "forward", "line": "train.py:16",
          "index": 9, "inputs_identical": True, "cause": "op", "aligned_by": "ops"}
SENTENCE = ("first divergent op: `aten::uniform_` in `Net.pool` (forward) at train.py:16, step 2, "
            "inputs identical → the op itself")


def _study(api, **change) -> tuple[int, dict[tuple[int, int], int]]:
    """A managed torch study (seeds 0 and 1, two repeats at strict), cancelled so no run waits for a worker."""
    sid = api.post("/api/v1/studies", json=spec(seeds=[0, 1], repeats=2, determinism=["strict"], **change)).json()["id"]
    runs = api.get(f"/api/v1/studies/{sid}/runs").json()["items"]
    assert api.post(f"/api/v1/studies/{sid}/cancel").status_code == 200
    return sid, {(r["seed"], r["repeat"]): r["id"] for r in runs}


def _ask(api, sid: int, runs, role: str = "user"):
    return api.post(f"/api/v1/studies/{sid}/localization-jobs", json={"runs": list(runs)}, role=role)


def _lease(api, worker_id: int, request_id: str | None = None, **body):
    r = api.post(f"/api/v1/workers/{worker_id}/localization-lease", role="worker",
                 json={**({"request_id": request_id} if request_id else {}), **body})
    assert r.status_code in (200, 204), r.text
    return r.json() if r.status_code == 200 else None


def _expire(api, job_id: int) -> None:
    from steady.server.models import LocalizationJob, utcnow

    with api.app.state.database.write() as s:
        s.get(LocalizationJob, job_id).lease_expires_at = utcnow() - timedelta(seconds=1)


def test_a_pair_that_is_not_two_replayable_repeats_is_422_naming_runs_and_a_second_ask_409(api):
    sid, ids = _study(api)
    _, other = _study(api)
    ext = api.post("/api/v1/studies", json={"name": "imported", "kind": "external", "metrics": ["loss"]}).json()["id"]
    uploaded = [api.post(f"/api/v1/studies/{ext}/runs", json={
        "seed": 0, "repeat": k, "determinism": "seeded", "stack": {"name": "cpu"},
        "metrics": {"loss": {"steps": [0], "values": [1.0]}}}).json()["id"] for k in (0, 1)]
    python = api.post("/api/v1/studies", json=spec(seeds=[0], repeats=2, determinism=["strict"], workload={
        "framework": "python", "command": ["python", "train.py", "--seed", "{seed}"]}))
    assert python.status_code == 201, python.text
    py_runs = [r["id"] for r in api.get(f"/api/v1/studies/{python.json()['id']}/runs").json()["items"]]
    a, b = ids[0, 0], ids[0, 1]
    for study, runs, loc, why in [
        (sid, (a, a), ["body", "runs"], "cannot part from itself"),
        (sid, (a, ids[1, 0]), ["body", "runs"], "not repeats"),
        (sid, (a, other[0, 1]), ["body", "runs", 1], f"is not a run of study {sid}"),
        (sid, (a, b, ids[1, 0]), ["body", "runs"], ""),
        (sid, (a,), ["body", "runs"], ""),
        (ext, uploaded, ["body", "runs"], "external study"),
        (python.json()["id"], py_runs, ["body", "runs"], "framework 'python'"),
    ]:
        r = _ask(api, study, runs)
        assert r.status_code == 422, (runs, r.text)
        assert error_of(r)["loc"] == loc and why in error_of(r)["msg"], r.json()
    assert api.get(f"/api/v1/studies/{sid}/localization-jobs").json()["items"] == []

    first = _ask(api, sid, (a, b))
    assert first.status_code == 201, first.text
    job = first.json()
    assert (job["status"], job["run_ids"], job["attempt"], job["step"]) == ("pending", [a, b], 0, None)
    for runs in ((a, b), (b, a)):  # the same pair, in either order, while the first is pending
        again = _ask(api, sid, runs)
        assert again.status_code == 409 and f"job {job['id']}" in error_of(again)["msg"], again.text
    assert _ask(api, sid, (ids[1, 0], ids[1, 1])).status_code == 201  # another pair is another job
    listed = api.get(f"/api/v1/studies/{sid}/localization-jobs").json()
    assert listed["total"] == 2 and [j["run_ids"] for j in listed["items"]] == [[ids[1, 0], ids[1, 1]], [a, b]]
    second = api.get(f"/api/v1/studies/{sid}/localization-jobs", params={"limit": 1, "offset": 1}).json()
    assert (second["total"], second["limit"], second["offset"]) == (2, 1, 1) and second["items"][0]["id"] == job["id"]
    assert api.get(f"/api/v1/localization-jobs/{job['id']}").json()["status"] == "pending"
    assert api.get("/api/v1/localization-jobs/999999").status_code == 404
    # an admin may cancel it (the owner rule: tests/scale/test_authz.py)
    r = api.post(f"/api/v1/localization-jobs/{job['id']}/cancel", role="admin")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert _ask(api, sid, (a, b)).status_code == 201  # cancelled: the pair may be asked for again


def test_recorded_step_digests_that_agree_answer_at_once_and_ones_that_part_give_the_step(api):
    sid, ids = _study(api, localize="steps")
    from steady.server.models import MetricChunk

    def record(run_id: int, values: list[float]) -> None:
        import numpy as np

        with api.app.state.database.write() as s:
            s.add(MetricChunk(run_id=run_id, attempt=0, seq=0, key="steady.step_digest", n=len(values), step_min=0,
                              step_max=len(values) - 1, steps=np.arange(len(values), dtype="<i8").tobytes(),
                              values=np.asarray(values, dtype="<f8").tobytes()))

    record(ids[0, 0], [1.0, 2.0, 3.0])
    record(ids[0, 1], [1.0, 2.0, 3.0])
    record(ids[1, 0], [1.0, 2.0, 3.0])
    record(ids[1, 1], [1.0, 2.5, 3.5])
    same = _ask(api, sid, (ids[0, 0], ids[0, 1])).json()
    assert same["status"] == "done" and same["result"]["status"] == "identical" and same["result"]["replays"] == 0
    assert "identical at all 3 steps" in same["result"]["sentence"]
    parted = _ask(api, sid, (ids[1, 0], ids[1, 1])).json()
    assert (parted["status"], parted["step"]) == ("pending", 1)
    worker = register(api)
    leased = _lease(api, worker)
    assert leased["step"] == 1 and leased["job_id"] == parted["id"]
    assert leased["time_limit_s"] < 2 * 1800  # one pair of replays, not two


@BOTH_BACKENDS
def test_a_worker_leases_the_job_like_a_run_and_its_answer_is_kept_as_the_clis(api):
    sid, ids = _study(api)
    pair = (ids[0, 0], ids[0, 1])
    worker = register(api)
    assert _lease(api, worker) is None  # nothing asked yet
    job = _ask(api, sid, pair).json()
    # the run lease announces the job: no run to take, one localization waiting
    r = api.post(f"/api/v1/workers/{worker}/lease", role="worker", json={"worker_id": worker})
    assert r.status_code == 204 and r.headers["X-Steady-Localizations"] == "1", r.headers
    assert _lease(api, worker, study_id=sid + 1000) is None  # a worker launched for another study
    assert _lease(api, register(api, "gpu-only", labels=("gpu",))) is None  # labels: a torch job needs torch
    leased = _lease(api, worker, "req-00000001")
    assert leased["job_id"] == job["id"] and leased["run_ids"] == list(pair) and leased["attempt"] == 1
    for run_id, got in zip(pair, leased["specs"], strict=True):
        assert got == api.get(f"/api/v1/runs/{run_id}/spec").json()  # what `steady localize` replays
    assert _lease(api, worker, "req-00000001") == leased  # its answer was lost: the same job again
    assert _lease(api, register(api, "w2")) is None  # one worker holds it
    shown = api.get(f"/api/v1/localization-jobs/{job['id']}").json()
    assert shown["status"] == "running" and shown["worker_name"] == "w1"

    url = f"/api/v1/localization-jobs/{job['id']}"
    ack = api.post(f"{url}/heartbeat", role="worker", json={"lease_id": leased["lease_id"]})
    assert ack.status_code == 200 and ack.json()["cancel"] is False
    wrong = api.post(f"{url}/heartbeat", role="worker", json={"lease_id": "x" * 32})
    assert wrong.status_code == 409 and error_of(wrong)["type"] == "lease_lost"
    assert api.post(f"{url}/heartbeat", role="user", json={"lease_id": leased["lease_id"]}).status_code == 403

    done = {"lease_id": leased["lease_id"], "request_id": "done-00000001", "status": "localized", "step": 2,
            "replays": 2, "answer": ANSWER, "sentence": SENTENCE}
    bad = api.post(f"{url}/complete", role="worker", json={**done, "answer": {**ANSWER, "phase": "warmup"}})
    assert bad.status_code == 422, bad.text  # not an answer: refused, the job still runs
    first = api.post(f"{url}/complete", role="worker", json=done)
    assert first.status_code == 200 and first.json() == {"job_id": job["id"], "status": "done", "duplicate": False}
    again = api.post(f"{url}/complete", role="worker", json=done)  # a retry whose answer was lost
    assert again.status_code == 200 and again.json()["duplicate"] is True
    late = api.post(f"{url}/fail", role="worker", json={"lease_id": leased["lease_id"], "request_id": "fail-0000001",
                                                         "error": "late"})
    assert late.status_code == 409 and error_of(late)["type"] == "already_finished"

    kept = api.get(f"/api/v1/studies/{sid}/localizations").json()["items"]
    assert len(kept) == 1 and kept[0]["run_ids"] == list(pair) and kept[0]["answer"] == {
        **ANSWER, "note": "", "ops_compared": 0} and kept[0]["sentence"] == SENTENCE
    shown = api.get(url).json()
    assert shown["status"] == "done" and shown["result"]["sentence"] == SENTENCE and shown["finished_at"]
    page = api.client.get(f"/runs/{pair[0]}", headers=api.h())
    assert page.status_code == 200 and SENTENCE.split(",")[0] in page.text and 'data-localization-job="done"' in page.text


@BOTH_BACKENDS
def test_cancel_expiry_failure_and_release(api):
    sid, ids = _study(api)
    worker = register(api)
    pair, other = (ids[0, 0], ids[0, 1]), (ids[1, 0], ids[1, 1])

    # a running job is cancelled through its heartbeat; the worker then reports it cancelled
    job = _ask(api, sid, pair).json()
    leased = _lease(api, worker)
    url = f"/api/v1/localization-jobs/{job['id']}"
    assert api.post(f"{url}/cancel").json()["cancel_requested"] is True
    assert api.post(f"{url}/heartbeat", role="worker", json={"lease_id": leased["lease_id"]}).json()["cancel"] is True
    r = api.post(f"{url}/fail", role="worker", json={"lease_id": leased["lease_id"], "kind": "cancelled",
                                                      "error": "cancelled"})
    assert r.status_code == 200 and r.json()["status"] == "cancelled"

    # a worker that stops heartbeating: the job is leased once more, then failed
    job = _ask(api, sid, other).json()
    url = f"/api/v1/localization-jobs/{job['id']}"
    first = _lease(api, worker)
    _expire(api, job["id"])
    second = _lease(api, worker)
    assert second["job_id"] == job["id"] and second["attempt"] == 2 and second["lease_id"] != first["lease_id"]
    stale = api.post(f"{url}/complete", role="worker", json={"lease_id": first["lease_id"], "status": "identical",
                                                              "sentence": "x"})
    assert stale.status_code == 409 and error_of(stale)["type"] == "lease_lost"
    _expire(api, job["id"])
    assert _lease(api, worker) is None
    shown = api.get(url).json()
    assert shown["status"] == "failed" and "stopped heartbeating" in shown["error"]

    # a failure keeps its reason; a release (agent shutting down) gives the job back, uncounted
    job = _ask(api, sid, other).json()
    url = f"/api/v1/localization-jobs/{job['id']}"
    leased = _lease(api, worker)
    r = api.post(f"{url}/release", role="worker", json={"lease_id": leased["lease_id"]})
    assert r.status_code == 200 and r.json()["status"] == "pending"
    assert api.get(url).json()["attempt"] == 0
    leased = _lease(api, worker)
    reason = "the worker could not fetch or unpack the study's code 0123456789ab: HTTP 404"
    r = api.post(f"{url}/fail", role="worker", json={"lease_id": leased["lease_id"], "error": reason})
    assert r.status_code == 200 and r.json()["status"] == "failed"
    shown = api.get(url).json()
    assert shown["status"] == "failed" and shown["error"] == reason
    page = api.client.get(f"/runs/{other[0]}", headers=api.h())
    assert 'data-localization-job="failed"' in page.text and "could not fetch or unpack" in page.text


def _session(api, role: str = "user") -> str:
    r = api.client.post("/login", data={"token": api.tokens[role]}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return r.cookies["steady_session"]


def test_the_localize_button_needs_the_owners_session_its_form_key_and_this_origin(api):
    from steady.server.dashboard.access import form_key

    sid, ids = _study(api)
    pair = [ids[0, 0], ids[0, 1]]
    sid_cookie = _session(api)
    api.client.cookies.set("steady_session", sid_cookie)
    try:
        page = api.client.get(f"/runs/{pair[0]}")
        assert page.status_code == 200 and "data-localize-button" in page.text and form_key(sid_cookie) in page.text
        form = {"runs": [str(r) for r in pair], "form_key": form_key(sid_cookie), "next": f"/runs/{pair[0]}"}
        for data, headers in (({**form, "form_key": "0" * 64}, {}), (form, {"origin": "http://elsewhere.example"})):
            r = api.client.post(f"/studies/{sid}/localize", data=data, headers=headers, follow_redirects=False)
            assert r.status_code == 403, r.text
        assert api.get(f"/api/v1/studies/{sid}/localization-jobs").json()["total"] == 0

        r = api.client.post(f"/studies/{sid}/localize", data=form, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == f"/runs/{pair[0]}#localization", r.headers
        (job,) = api.get(f"/api/v1/studies/{sid}/localization-jobs").json()["items"]
        assert job["run_ids"] == pair and job["status"] == "pending"
        page = api.client.get(f"/runs/{pair[0]}")
        assert 'data-localization-job="pending"' in page.text and "waiting for a worker" in page.text
        assert 'http-equiv="refresh"' in page.text  # the page follows the job until it ends
        r = api.client.post(f"/studies/{sid}/localize", data=form, follow_redirects=True)  # the same pair again
        assert r.status_code == 200 and "data-localize-error" in r.text and "already being localized" in r.text
    finally:
        api.client.cookies.clear()

    # another user sees no button, and a post of theirs is refused with the owner rule
    from steady.server.kit.auth import Role, create_token

    with api.app.state.database.write() as s:
        _, theirs = create_token(s, name="someone else", role=Role.user)
    r = api.client.post("/login", data={"token": theirs}, follow_redirects=False)
    other_sid = r.cookies["steady_session"]
    api.client.cookies.set("steady_session", other_sid)
    try:
        page = api.client.get(f"/runs/{ids[1, 0]}")
        assert page.status_code == 200 and "data-localize-button" not in page.text
        r = api.client.post(f"/studies/{sid}/localize", follow_redirects=True, data={
            "runs": [str(ids[1, 0]), str(ids[1, 1])], "form_key": form_key(other_sid), "next": f"/runs/{ids[1, 0]}"})
        assert r.status_code == 200 and "another user" in r.text
    finally:
        api.client.cookies.clear()
    assert api.get(f"/api/v1/studies/{sid}/localization-jobs").json()["total"] == 1


@POSTGRES_ONLY
def test_two_asks_for_one_pair_at_once_make_one_job(api):
    """Read committed: two requests for one pair whose transactions overlap would each find no active job and
    each insert one. The second must wait for the first to commit, then get the 409."""
    import threading

    from sqlalchemy import create_engine, select, text

    from steady.server.kit.auth import Role
    from steady.server.kit.deps import Principal
    from steady.server.kit.errors import Conflict
    from steady.server.lifecycle import localizing
    from steady.server.models import LocalizationJob, Study

    sid, ids = _study(api)
    pair = [ids[0, 0], ids[0, 1]]
    database = api.app.state.database
    with database.read() as session:
        owner = session.get(Study, sid).owner_token_id
    caller = Principal(token_id=owner, name="user", role=Role.user)
    second: dict[str, object] = {}

    def ask_again() -> None:
        try:
            with database.write() as session:
                second["job"] = localizing.request(session, sid, localizing.LocalizationJobRequest(runs=pair[::-1]), caller).id
        except Conflict as exc:
            second["conflict"] = str(exc)

    # autocommit: pg_stat_activity is read once per transaction, so each poll is a transaction of its own
    monitor = create_engine(database.engine.url.render_as_string(hide_password=False), isolation_level="AUTOCOMMIT")
    waiting = text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
    thread = threading.Thread(target=ask_again)
    try:
        with database.write() as session:
            first = localizing.request(session, sid, localizing.LocalizationJobRequest(runs=pair), caller).id
            thread.start()  # the first request's transaction is still open
            with monitor.connect() as conn:
                wait_until(lambda: bool(conn.execute(waiting).scalar()) or not thread.is_alive(), 60,
                           what="the second request to wait for the first's lock (or to finish without waiting)")
            assert thread.is_alive(), f"the second request did not wait for the first: {second}"
        thread.join(60)
    finally:
        thread.join(60)
        monitor.dispose()
    assert "job" not in second and f"job {first}" in str(second.get("conflict")), second
    with database.read() as session:
        jobs = session.scalars(select(LocalizationJob.id).where(LocalizationJob.study_id == sid)).all()
    assert jobs == [first]
