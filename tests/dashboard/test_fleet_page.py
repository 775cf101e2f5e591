"""The fleet page in a real browser: every worker × the recent fleet checks, the worker a check named (and
quarantined) in red with its history below; the other workers not. Screenshot: artifacts/screenshots/fleet.png."""

from __future__ import annotations

from steady.server.alerts import quarantine
from steady.server.kit.db import Database
from steady.server.models import Study
from tests.dashboard.conftest import shot

NAMES = ("gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e")
BAD = "gpu-c"


def test_the_fleet_page_shows_the_faulty_worker_red_with_its_history(live_server_factory, new_page):
    server = live_server_factory()
    with server.client("worker") as c:
        ids = {n: c.post("/api/v1/workers/register", json={"name": n, "labels": ["torch"]}).json()["worker_id"]
               for n in NAMES}
    with server.client() as c:
        checks = [c.post("/api/v1/studies", json={"name": f"nightly fleet {i}", "kind": "external",
                                                  "metrics": ["loss"]}).json()["id"] for i in (1, 2)]
    database = Database(server.database_url)
    try:
        with database.write() as session:  # as the fleet report hands its results over
            first, second = (session.get(Study, sid) for sid in checks)
            quarantine.apply_fleet_result(session, first, [quarantine.WorkerCheck(ids[n], "agrees") for n in NAMES],
                                          base_url=server.url)
            named = quarantine.apply_fleet_result(session, second, [
                quarantine.WorkerCheck(ids[n], "faulty" if n == BAD else "agrees",
                                       first_divergent_step=17 if n == BAD else None) for n in NAMES],
                base_url=server.url, quarantine_faulty=True)
        assert named == [ids[BAD]]
    finally:
        database.dispose()

    page = new_page(server)
    page.goto(server.url + "/fleet")
    rows = page.locator("table.fleet tbody tr")
    assert rows.count() == len(NAMES)
    assert page.locator("table.fleet thead th").all_inner_texts()[2].startswith("nightly fleet 2")  # newest first
    bad = page.locator(f"#worker-{ids[BAD]}")
    assert bad.get_attribute("class") == "row-bad" and bad.get_attribute("data-quarantined") is not None
    cells = bad.locator("td").all_inner_texts()
    assert cells[0].startswith("quarantined") and cells[1:] == ["parts from step 17", "agrees"]
    red = bad.locator("th").evaluate("e => getComputedStyle(e).backgroundColor")
    assert red == "rgb(251, 230, 228)"  # --bad-bg
    for n in NAMES:
        if n != BAD:
            row = page.locator(f"#worker-{ids[n]}")
            assert row.get_attribute("class") == "" and row.locator("td").all_inner_texts() == [
                "leasing", "agrees", "agrees"]
    history = page.locator(f"#history-{ids[BAD]}")
    assert history.is_visible() and page.locator("section[id^=history-]").count() == 1
    assert "Quarantined since" in history.inner_text() and "from step 17" in history.inner_text()
    assert history.locator("tbody tr td:nth-child(2)").all_inner_texts() == ["quarantined", "check", "check"]
    assert "Fleet" in page.locator("nav a[aria-current=page]").inner_text()
    assert not page.console_errors and not page.csp_violations
    shot(page, "fleet")

    # a healthy worker's history on request
    page.click(f"#worker-{ids['gpu-a']} th a")
    assert page.locator(f"#history-{ids['gpu-a']} tbody tr").count() == 2

    # the workers page marks the quarantined worker, and links to its row here
    page.goto(server.url + "/workers")
    marked = page.locator("[data-quarantined]")
    assert marked.count() == 1 and marked.get_attribute("href") == f"/fleet#worker-{ids[BAD]}"
    assert page.locator(f"tr[data-worker-id='{ids[BAD]}'] [data-quarantined]").count() == 1
