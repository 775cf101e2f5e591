"""Authorization over every route: enumerated from steady.server.routes, so a new route is covered automatically."""

from __future__ import annotations

import hashlib
import re

import pytest
from fastapi.routing import APIRoute

from steady.server.kit.auth import GRANTS, Role
from steady.server.web.main import create_app
from tests.api.helpers import batch, error_msg, lease, register, spec

# Routes anyone may call; any other route without a role check fails test_every_route_declares_a_role.
# /docs and /redoc serve the API reference (Swagger UI / ReDoc, served from the package), public like /openapi.json
PUBLIC = {("GET", "/healthz"), ("GET", "/"), ("GET", "/login"), ("POST", "/login"), ("POST", "/logout"),
          ("GET", "/docs"), ("GET", "/redoc")}
# The dashboard's form posts: a session cookie, its form key and this origin name the caller, then the same service
# and owner rule as the API route decide (tests/api/test_localization_jobs.py::test_the_localize_button_needs_*).
FORM_WRITES = {("POST", "/studies/{study_id}/localize")}
# User writes of no one's object: a code archive is named by its content, so re-uploading it
# (any user) changes nothing; checked in test_code_upload_belongs_to_no_one.
SHARED_WRITES = {("PUT", "/api/v1/code/{sha256}")}
# Guards other than require(role): the dashboard's viewer checks and /metrics admit user roles.
# mlflow_caller: a user/admin token, or a run's own credential for that run (steady.server.mlflow.router).
USER_GUARDS = {"page_viewer", "data_viewer", "_metrics_access", "mlflow_caller"}
MLFLOW = "/mlflow/api/2.0/mlflow"
# User writes that touch nobody's objects: creating an experiment (an external study of the
# caller's own) and the 501 answer to MLflow methods Steady does not implement.
OWNERLESS_WRITES = {("POST", f"{MLFLOW}/experiments/create"),
                    *((m, MLFLOW + "/{method:path}") for m in ("POST", "PATCH", "DELETE"))}


def _roles(route: APIRoute) -> frozenset[Role] | None:
    """The token roles a route admits (from its require(role) dependency), or None if it has none."""
    stack = list(route.dependant.dependencies)
    while stack:
        dep = stack.pop()
        call = dep.call
        if getattr(call, "__qualname__", "").startswith("require.<locals>"):
            cells = dict(zip(call.__code__.co_freevars, (c.cell_contents for c in call.__closure__ or ())))
            return cells["allowed"]
        if getattr(call, "__name__", "") in USER_GUARDS:
            return GRANTS[Role.user]
        stack.extend(dep.dependencies)
    return None


def _walk(routes, prefix: str = ""):
    for r in routes:
        if isinstance(r, APIRoute):
            yield prefix + r.path, r
        elif hasattr(r, "original_router"):  # FastAPI >= 0.12x keeps included routers as nodes
            yield from _walk(r.original_router.routes, prefix + (getattr(r.include_context, "prefix", "") or ""))


def _routes() -> list[tuple[str, str, APIRoute]]:
    app = create_app()
    return [(m, path, r) for path, r in _walk(app.routes) for m in sorted(r.methods)]


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "1", path)


def test_every_route_declares_a_role():
    missing = [(m, p) for m, p, r in _routes() if _roles(r) is None and (m, p) not in PUBLIC | FORM_WRITES]
    assert not missing, f"routes without a role check (add one, or list them in PUBLIC): {missing}"


def test_each_role_is_refused_where_it_does_not_belong(api):
    """No token, a bad token, and every role outside a route's grants: refused (API 401/403; pages redirect to login)."""
    api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["seeded"]))
    checked = 0
    for method, path, route in _routes():
        allowed = _roles(route)
        if allowed is None:
            continue
        url = _concrete(path)
        api_route = path.startswith("/api/")
        refused = {401, 403} if api_route else {401, 403, 303}
        for label, headers in (("no token", {}), ("bad token", {"Authorization": "Bearer stdy_not-a-token"})):
            r = api.client.request(method, url, json={}, headers=headers, follow_redirects=False)
            assert r.status_code in ({401} if api_route else refused), (method, path, label, r.status_code)
        for role in Role:
            if role in allowed:
                continue
            r = api.client.request(method, url, json={}, headers=api.h(role.value), follow_redirects=False)
            assert r.status_code in refused and (r.status_code == 403 or not api_route), \
                (method, path, role.value, r.status_code, r.text[:200])
            checked += 1
    assert checked >= 30


def test_worker_token_cannot_reach_other_workers_or_runs(api):
    api.post("/api/v1/studies", json=spec(seeds=[0, 1], repeats=1, determinism=["seeded"]))
    mine = register(api, "a")
    theirs_token = api.post("/api/v1/tokens", role="admin", json={"name": "other", "role": "worker"}).json()["token"]
    other = {"Authorization": f"Bearer {theirs_token}"}
    leased = lease(api, mine)
    run_id = leased["run_id"]
    # another worker token can neither lease as my worker nor write to my run without its lease
    assert api.client.post(f"/api/v1/workers/{mine}/lease", json={"worker_id": mine}, headers=other).status_code == 404
    r = api.client.post(f"/api/v1/runs/{run_id}/metrics", json=batch("0" * 32, 0, "loss", [0], [1.0]), headers=other)
    assert r.status_code == 409
    for path in (f"/api/v1/runs/{run_id}", f"/api/v1/runs/{run_id}/metrics/loss", "/api/v1/studies", "/api/v1/studies/1/runs"):
        assert api.client.get(path, headers=other).status_code == 403


def test_tokens_are_stored_hashed_and_compared_in_constant_time(api, monkeypatch):
    from steady.server.kit import auth

    secret = api.tokens["user"]
    with api.app.state.database.read() as s:
        from steady.server.models import ApiToken

        rows = [(r.token_hash, r.name, r.prefix) for r in s.query(ApiToken)]
    assert rows and all(secret not in r for r in rows)
    assert hashlib.sha256(secret.encode()).hexdigest() in {r[0] for r in rows}
    assert all(len(r[2]) < len(secret) // 3 for r in rows), "only a short prefix is kept in clear"
    calls = []
    real = auth.hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
    assert api.get("/api/v1/studies").status_code == 200
    assert calls, "token check must go through hmac.compare_digest"


@pytest.mark.parametrize("role", ["user", "worker"])
def test_revoked_token_is_refused(api, role):
    tokens = api.get("/api/v1/tokens", role="admin").json()["items"]
    tid = next(t["id"] for t in tokens if t["role"] == role)
    assert api.delete(f"/api/v1/tokens/{tid}", role="admin").status_code == 200
    path = "/api/v1/studies" if role == "user" else "/api/v1/workers/register"
    r = api.client.request("GET" if role == "user" else "POST", path, headers=api.h(role), json={"name": "x"})
    assert r.status_code == 401


# --- ownership: users change their own objects, admins all, every user reads everything ----------

BAND_RULE = {"kind": "band_width", "metric": "loss", "max": 1.0}


def _second_user(api) -> dict[str, str]:
    token = api.post("/api/v1/tokens", role="admin", json={"name": "other-user", "role": "user"}).json()["token"]
    return {"Authorization": f"Bearer {token}"}


def _owned_objects(api) -> dict[tuple[str, str], tuple[str, dict | None]]:
    """Objects of the first user token; for each user write route, the concrete URL and body that touch them."""
    managed = api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["seeded"], suite="nightly"))
    assert managed.status_code == 201, managed.text
    sid = managed.json()["id"]
    ext = api.post("/api/v1/studies", json={"name": "imported", "kind": "external", "metrics": ["loss"]}).json()["id"]
    run = {"seed": 0, "determinism": "seeded", "stack": {"name": "a100"},
           "metrics": {"loss": {"steps": [0, 1], "values": [1.0, 0.5]}}}
    run_id = api.post(f"/api/v1/studies/{ext}/runs", json=run).json()["id"]
    again = api.post(f"/api/v1/studies/{ext}/runs", json={**run, "repeat": 1}).json()["id"]  # a repeat of it
    localization = {"run_ids": [run_id, again], "status": "identical", "replays": 2,
                    "sentence": "the replays did not part"}
    rule = api.post("/api/v1/alert-rules", json={**BAND_RULE, "study_id": sid})
    assert rule.status_code == 201, rule.text
    # a baseline freezes a settled study: an external one in the suite (the managed one is still queued)
    frozen = api.post("/api/v1/studies", json={"name": "frozen", "kind": "external", "metrics": ["loss"],
                                               "suite": "nightly"}).json()["id"]
    assert api.client.put("/api/v1/suites/nightly/baseline", json={"study_id": frozen},
                          headers=api.h()).status_code == 200
    from steady.server.models import Alert

    with api.app.state.database.write() as s:
        alert = Alert(dedupe_key="k" * 64, rule_id=rule.json()["id"], kind="band_width", severity="warning",
                      state="firing", study_id=sid, summary="wide", link="/")
        s.add(alert)
        s.flush()
        alert_id = alert.id
    # two repeats of a managed study to localize (seed 0), and a localization job of another pair to cancel
    repeated = api.post("/api/v1/studies", json=spec(seeds=[0, 1], repeats=2, determinism=["seeded"])).json()["id"]
    pairs: dict[int, list[int]] = {}
    for r in api.get(f"/api/v1/studies/{repeated}/runs").json()["items"]:
        pairs.setdefault(r["seed"], []).append(r["id"])
    job = api.post(f"/api/v1/studies/{repeated}/localization-jobs", json={"runs": pairs[1]})
    assert job.status_code == 201, job.text
    mlf = api.client.post(f"{MLFLOW}/runs/create", json={"experiment_id": str(ext)}, headers=api.h())
    assert mlf.status_code == 200, mlf.text
    mlf_run = mlf.json()["run"]["info"]["run_id"]
    in_suite = {"name": "nightly check", "every": "6h",
                "spec": spec(seeds=[0], repeats=1, determinism=["seeded"], suite="nightly")}
    schedule = api.post("/api/v1/schedules", json=in_suite)
    assert schedule.status_code == 201, schedule.text
    return {
        ("POST", "/api/v1/schedules"): ("/api/v1/schedules", {**in_suite, "name": "another nightly check"}),
        ("DELETE", "/api/v1/schedules/{schedule_id}"): (f"/api/v1/schedules/{schedule.json()['id']}", None),
        ("POST", f"{MLFLOW}/runs/create"): (f"{MLFLOW}/runs/create", {"experiment_id": str(ext)}),
        ("POST", f"{MLFLOW}/runs/log-metric"): (f"{MLFLOW}/runs/log-metric",
                                              {"run_id": mlf_run, "key": "loss", "value": 1.0, "step": 0}),
        ("POST", f"{MLFLOW}/runs/log-batch"): (f"{MLFLOW}/runs/log-batch", {"run_id": mlf_run, "params": [
            {"key": "seed", "value": "0"}]}),
        ("POST", f"{MLFLOW}/runs/log-parameter"): (f"{MLFLOW}/runs/log-parameter",
                                                 {"run_id": mlf_run, "key": "lr", "value": "0.1"}),
        ("POST", f"{MLFLOW}/runs/set-tag"): (f"{MLFLOW}/runs/set-tag", {"run_id": mlf_run, "key": "t", "value": "v"}),
        ("POST", f"{MLFLOW}/runs/update"): (f"{MLFLOW}/runs/update", {"run_id": mlf_run, "status": "FINISHED"}),
        ("POST", "/api/v1/studies"): ("/api/v1/studies", spec(seeds=[0], repeats=1, determinism=["seeded"], suite="nightly")),
        ("POST", "/api/v1/studies/{study_id}/cancel"): (f"/api/v1/studies/{sid}/cancel", None),
        ("POST", "/api/v1/studies/{study_id}/launches"): (f"/api/v1/studies/{sid}/launches",
                                                         {"engine": "slurm", "job_id": "123", "tasks": 2}),
        ("POST", "/api/v1/studies/{study_id}/runs"): (f"/api/v1/studies/{ext}/runs", run),
        ("POST", "/api/v1/studies/{study_id}/localizations"): (f"/api/v1/studies/{ext}/localizations", localization),
        ("POST", "/api/v1/studies/{study_id}/localization-jobs"): (f"/api/v1/studies/{repeated}/localization-jobs",
                                                                   {"runs": pairs[0]}),
        ("POST", "/api/v1/localization-jobs/{job_id}/cancel"): (f"/api/v1/localization-jobs/{job.json()['id']}/cancel",
                                                               None),
        ("POST", "/api/v1/runs/{run_id}/exclude"): (f"/api/v1/runs/{run_id}/exclude", {"reason": "bad data"}),
        ("DELETE", "/api/v1/runs/{run_id}/exclude"): (f"/api/v1/runs/{run_id}/exclude", None),
        ("POST", "/api/v1/alert-rules"): ("/api/v1/alert-rules", {**BAND_RULE, "name": "mine", "study_id": sid}),
        ("DELETE", "/api/v1/alert-rules/{rule_id}"): (f"/api/v1/alert-rules/{rule.json()['id']}", None),
        ("PUT", "/api/v1/suites/{suite}/baseline"): ("/api/v1/suites/nightly/baseline", {"study_id": frozen}),
        ("DELETE", "/api/v1/suites/{suite}/baseline"): ("/api/v1/suites/nightly/baseline", None),
        ("POST", "/api/v1/studies/{study_id}/evaluate"): (f"/api/v1/studies/{sid}/evaluate", None),
        ("POST", "/api/v1/alerts/{alert_id}/ack"): (f"/api/v1/alerts/{alert_id}/ack", None),
    }


def test_a_user_cannot_change_another_users_objects(api):
    """Every state-changing route open to users: another user gets 403 naming the owner rule; reading stays open."""
    targets = _owned_objects(api)
    user_writes = {(m, p) for m, p, r in _routes()
                   if (roles := _roles(r)) is not None and Role.user in roles and m not in ("GET", "HEAD")} - SHARED_WRITES
    assert user_writes - OWNERLESS_WRITES == set(targets), (
        f"add the new user write routes to _owned_objects: {(user_writes - OWNERLESS_WRITES) ^ set(targets)}")
    other = _second_user(api)
    created = api.client.post(f"{MLFLOW}/experiments/create", json={"name": "theirs"}, headers=other)
    assert created.status_code == 200, created.text  # their own external study
    assert api.client.post(f"{MLFLOW}/runs/search", json={}, headers=other).status_code == 501
    # a global rule watches everyone's studies: admins only
    r = api.client.post("/api/v1/alert-rules", json={**BAND_RULE, "name": "global"}, headers=other)
    assert r.status_code == 403 and "admin" in error_msg(r)
    for (method, path), (url, body) in targets.items():
        r = api.client.request(method, url, json=body, headers=other)
        assert r.status_code == 403, (method, path, r.status_code, r.text[:300])
        body = r.json()
        assert "another user" in (body["message"] if "message" in body else error_msg(r)), (method, path, r.text)
    # reading stays open to every user
    sid = int(targets[("POST", "/api/v1/studies/{study_id}/cancel")][0].split("/")[4])
    for url in (f"/api/v1/studies/{sid}", "/api/v1/studies", "/api/v1/alert-rules", "/api/v1/alerts",
                "/api/v1/suites/nightly/baseline", f"/api/v1/studies/{sid}/report",
                "/api/v1/suites/nightly/baseline/history", f"/api/v1/suites/nightly/baseline/compare?study_id={sid}"):
        assert api.client.get(url, headers=other).status_code == 200, url
    # the study shows its owner; nothing was changed by the refused calls
    study = api.get(f"/api/v1/studies/{sid}").json()
    assert study["status"] == "queued" and study["owner_token_id"] is not None


@pytest.mark.parametrize("who", ["user", "admin"])
def test_the_owner_and_admins_change_it(api, who):
    targets = _owned_objects(api)
    order = [("POST", "/api/v1/studies"), ("POST", "/api/v1/studies/{study_id}/localizations"),
             ("POST", "/api/v1/studies/{study_id}/localization-jobs"), ("POST", "/api/v1/localization-jobs/{job_id}/cancel"),
             ("POST", "/api/v1/studies/{study_id}/runs"),
             ("POST", "/api/v1/runs/{run_id}/exclude"), ("DELETE", "/api/v1/runs/{run_id}/exclude"),
             ("POST", "/api/v1/alert-rules"), ("POST", "/api/v1/alerts/{alert_id}/ack"),
             ("POST", "/api/v1/studies/{study_id}/evaluate"), ("PUT", "/api/v1/suites/{suite}/baseline"),
             ("DELETE", "/api/v1/suites/{suite}/baseline"), ("DELETE", "/api/v1/alert-rules/{rule_id}"),
             ("POST", "/api/v1/studies/{study_id}/launches"), ("POST", "/api/v1/studies/{study_id}/cancel"),
             ("POST", f"{MLFLOW}/runs/create"), ("POST", f"{MLFLOW}/runs/log-metric"),
             ("POST", f"{MLFLOW}/runs/log-batch"), ("POST", f"{MLFLOW}/runs/log-parameter"),
             ("POST", f"{MLFLOW}/runs/set-tag"), ("POST", f"{MLFLOW}/runs/update"),
             ("POST", "/api/v1/schedules"), ("DELETE", "/api/v1/schedules/{schedule_id}")]
    assert set(order) == set(targets)
    for key in order:
        url, body = targets[key]
        r = api.client.request(key[0], url, json=body, headers=api.h(who))
        # evaluating a study that has not finished is a state conflict, not a refusal
        expected = {200, 201, 204} | ({409} if key[1].endswith("/evaluate") else set())
        assert r.status_code in expected, (key, who, r.status_code, r.text[:300])


def test_objects_without_an_owner_are_changed_by_admins_only(api):
    """Rows from before owners were recorded (owner NULL): users may not change them, admins may."""
    sid = api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["seeded"])).json()["id"]
    from steady.server.models import Study

    with api.app.state.database.write() as s:
        s.get(Study, sid).owner_token_id = None
    assert api.post(f"/api/v1/studies/{sid}/cancel").status_code == 403
    assert api.post(f"/api/v1/studies/{sid}/cancel", role="admin").status_code == 200


def test_code_upload_belongs_to_no_one(api):
    """The same archive uploaded by another user: accepted, nothing changes (content-addressed)."""
    import hashlib
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"pass"))
    data = buf.getvalue()
    url = f"/api/v1/code/{hashlib.sha256(data).hexdigest()}"
    assert api.client.put(url, content=data, headers=api.h()).json()["created"] is True
    again = api.client.put(url, content=data, headers=_second_user(api))
    assert again.status_code == 200 and again.json()["created"] is False
