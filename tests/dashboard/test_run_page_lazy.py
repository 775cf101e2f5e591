"""A run with many metric keys: the run page loads charts lazily (issue #13: one run page fired
10,241 chart requests)."""

from __future__ import annotations

import json

from tests.conftest import wait_until

KEYS = 120
MAX_CHART_REQUESTS_ON_LOAD = 12


def test_run_page_with_many_keys_fetches_only_visible_charts(live_server, new_page):
    with live_server.client() as c:
        sid = c.post("/api/v1/studies", json={"name": "many keys", "kind": "external", "metrics": ["k000"]}).json()["id"]
        metrics = {f"k{i:03d}": {"steps": list(range(50)), "values": [float(i + j) for j in range(50)]} for i in range(KEYS)}
        r = c.post(f"/api/v1/studies/{sid}/runs", content=json.dumps({"seed": 0, "metrics": metrics}),
                   headers={"content-type": "application/json"})
        assert r.status_code == 201, r.text
        run_id = r.json()["id"]
    page = new_page(live_server)
    requested: list[str] = []
    page.on("request", lambda req: "/chart?" in req.url and requested.append(req.url))
    page.goto(f"{live_server.url}/runs/{run_id}")
    page.wait_for_selector("figure[data-run-metric='k000'][data-ready='true']")
    page.wait_for_load_state("networkidle")
    on_load = len(requested)
    assert 1 <= on_load <= MAX_CHART_REQUESTS_ON_LOAD, on_load
    assert page.locator("figure[data-run-metric][data-ready='true']").count() == on_load
    # scrolling to the last chart loads it (and what it passes), never the whole page at once
    last = page.locator(f"figure[data-run-metric='k{KEYS - 1:03d}']")
    last.scroll_into_view_if_needed()
    wait_until(lambda: last.get_attribute("data-ready") == "true", timeout=15, what="last chart drawn")
    assert on_load < len(requested) < KEYS
    assert page.console_errors == [] and page.csp_violations == []
