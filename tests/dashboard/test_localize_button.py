"""The run page's Localize button, as a user drives it: a study of a user's own PyTorch script (a layer with
jitter from a generator nobody seeded) diverges between its repeats; a click on the run page asks for a
localization, a real worker leases it and replays the pair with the CLI's driver, and the page follows the
job (pending, replaying on the worker) to the answer that names the op and the layer.

A real `steady serve` (the shared one), a real `steady worker` for the runs and the replays, headless
Chromium: the process boundaries are the point.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.conftest import run_cli_in_process
from tests.dashboard.conftest import shot
from tests.reports.test_localize_e2e import _project
from tests.worker.test_worker_agent_e2e import Worker

pytestmark = [pytest.mark.browser, pytest.mark.slow]

OP = "first divergent op: `aten::uniform_` in `Net.pool` (forward) at train.py:16, step 0"


def _jobs(client, sid: str) -> list[dict]:
    r = client.get(f"/api/v1/studies/{sid}/localization-jobs")
    assert r.status_code == 200, r.text
    return r.json()["items"]


def test_the_localize_button_gets_the_op_named_by_a_worker(live_server, new_page, tmp_path):
    folder = _project(tmp_path / "project")
    env = {"STEADY_SERVER": live_server.url, "STEADY_TOKEN": live_server.tokens["user"], "NO_COLOR": "1",
           "HOME": str(folder), "XDG_CONFIG_HOME": str(folder / ".config"), "PATH": "/usr/bin:/bin"}
    (tmp_path / "worker-home").mkdir()
    worker = Worker(live_server, tmp_path, "localizer", "--concurrency", "2", cwd=tmp_path / "worker-home")
    sid = None
    try:
        submit = run_cli_in_process("submit", "study.yaml", "--wait", env=env, cwd=folder)
        found = re.search(r"submitted study (\d+)", submit.stdout + submit.stderr)
        assert found, (submit.stdout, submit.stderr, worker.log())
        sid = found.group(1)
        with live_server.client() as c:
            runs = c.get(f"/api/v1/studies/{sid}/runs").json()["items"]
        a, b = sorted(r["id"] for r in runs)

        page = new_page(live_server)
        page.goto(f"{live_server.url}/studies/{sid}")  # the diverging verdict offers it too
        assert page.locator('tr[data-level="repeatability"] [data-localize-button]').inner_text() == \
            f"Localize runs {a} and {b}"
        page.goto(f"{live_server.url}/runs/{a}")
        button = page.get_by_role("button", name=f"Localize runs {a} and {b}")
        button.click()
        page.wait_for_url(re.compile(rf"/runs/{a}(#localization)?$"))
        job = page.locator("[data-localization-job]").first
        assert job.get_attribute("data-localization-job") in ("pending", "running", "done"), page.content()
        seen = {job.get_attribute("data-localization-job")}

        with live_server.client() as c:  # the worker takes the job and replays the pair (two replays: step known)
            deadline = time.monotonic() + 240
            while (status := _jobs(c, sid)[0]["status"]) in ("pending", "running"):
                assert time.monotonic() < deadline, worker.log()
                if status == "running" and "running" not in seen:
                    page.reload()
                    if page.locator('[data-localization-job="running"]').count():
                        seen.add("running")
                        assert "replaying on worker localizer" in page.locator("[data-localization-job]").first.inner_text()
                time.sleep(0.5)
            (done,) = _jobs(c, sid)
        assert done["status"] == "done", (done, worker.log())
        assert done["result"]["status"] == "localized" and done["result"]["replays"] == 2, done
        answer = done["result"]["answer"]
        assert (answer["op"], answer["module"], answer["phase"], answer["line"]) == (
            "aten::uniform_", "Net.pool", "forward", "train.py:16")

        page.reload()
        assert page.locator('[data-localization-job="done"]').count() == 1
        assert OP in page.locator("[data-job-answer]").inner_text()
        assert OP in page.locator("[data-localization-sentence]").inner_text()  # the answer's own card
        assert page.locator('meta[http-equiv="refresh"]').count() == 0  # nothing left to follow
        assert not page.console_errors and not page.csp_violations
        shot(page, "run-localized")

        # the study's repeatability verdict carries it, and the report says it
        page.goto(f"{live_server.url}/studies/{sid}")
        assert OP in page.locator("[data-localization]").first.inner_text()
        report = run_cli_in_process("report", sid, env=env, cwd=folder)
        assert OP in report.stdout, report.stdout
    finally:
        worker.stop()
        if sid is not None:  # nothing left for a later test's worker
            with live_server.client() as c:
                for j in _jobs(c, sid):
                    if j["status"] in ("pending", "running"):
                        c.post(f"/api/v1/localization-jobs/{j['id']}/cancel")
