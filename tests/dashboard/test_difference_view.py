"""Issue #14: the 'difference from the reference repeat' view (absolute and in ULPs) and the
levels side by side."""

from __future__ import annotations

import pytest

from tests.dashboard.conftest import curve, shot, upload_external

pytestmark = pytest.mark.browser

PART_AT = 30
DELTA = 1e-7


def _study(client) -> int:
    """seeded (logged in float32): seed 0's second repeat is 1e-7 above its first from step 30 on, seed 1's repeats
    are identical; strict: every repeat identical; none: a third level, for 'all levels'."""
    r = client.post("/api/v1/studies", json={"name": "repeat-diff", "kind": "external",
                                             "metrics": [{"name": "loss"}]})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    for det in ("seeded", "strict", "none"):
        for seed in range(2):
            for rep in range(2):
                values = curve(seed, 200)
                if det == "seeded" and seed == 0 and rep == 1:
                    values = [v + DELTA if i >= PART_AT else v for i, v in enumerate(values)]
                if det == "none":
                    values = [v + 1e-4 * ((rep * 7 + seed * 3 + i) % 5) for i, v in enumerate(values)]
                # the seeded runs logged float32: their ULPs are float32 ULPs (1e-7 is 1–2 of them near 0.8)
                upload_external(client, sid, seed=seed, repeat=rep, determinism=det, values=values,
                                dtype="float32" if det == "seeded" else None)
    return sid


def _wait_view(page, group: str, view: str) -> dict:
    page.wait_for_function(
        "([g, v]) => { const m = document.querySelector('main'); const f = document.querySelector('figure[data-metric]');"
        " return m.dataset.chartsReady === 'true' && f.dataset.group === g && f.dataset.view === v; }",
        arg=[group, view])
    fig = page.locator("figure[data-metric='loss']")
    return {
        "first": fig.get_attribute("data-first-nonzero-step"),
        "max": fig.get_attribute("data-max-abs"),
        "identical": fig.get_attribute("data-identical"),
        "summary": fig.locator("[data-summary]").inner_text(),
        "legend": fig.locator(".u-legend").all_inner_texts(),
        "canvas": fig.locator("canvas").count(),
    }


def test_difference_view_abs_ulp_identical_and_all_levels(live_server, new_page):
    with live_server.client() as c:
        sid = _study(c)
        runs = c.get(f"/api/v1/studies/{sid}/runs", params={"limit": 100}).json()
    runs = runs.get("items", runs) if isinstance(runs, dict) else runs
    differing = next(r["id"] for r in runs if r["determinism"] == "seeded" and r["seed"] == 0 and r["repeat"] == 1)
    page = new_page(live_server)
    page.goto(f"{live_server.url}/studies/{sid}")
    assert page.locator("#sel-level").input_value() == "seeded"

    page.select_option("#sel-view", "abs")
    state = _wait_view(page, "seeded · default", "abs")
    assert state["first"] == str(PART_AT)
    assert float(state["max"]) == pytest.approx(DELTA, rel=1e-3)
    assert state["identical"] == "false" and state["canvas"] >= 1
    assert f"repeats first part at step {PART_AT}" in state["summary"]
    assert any(f"run {differing} −" in t for t in state["legend"])  # the legend names the run
    assert not page.locator("figure[data-metric='loss'] ul.legend").is_visible()  # the band key does not apply
    page.locator("figure[data-metric='loss']").scroll_into_view_if_needed()
    shot(page, "study-difference-abs", full_page=False)

    page.select_option("#sel-view", "ulp")
    state = _wait_view(page, "seeded · default", "ulp")
    assert state["first"] == str(PART_AT)
    ulps = float(state["max"])
    # float32 ULPs on values in (0.18, 0.8]: 1e-7 is 1–2 ULPs near 0.8 and ~7 (1.5e-8 each) near 0.19
    assert 1 <= ulps <= 8
    assert " ULP" in state["summary"]

    page.select_option("#sel-level", "strict")
    state = _wait_view(page, "strict · default", "ulp")
    assert state["identical"] == "true" and state["canvas"] == 0
    assert "repeats bitwise identical: no difference to draw" in state["summary"]

    page.select_option("#sel-view", "values")
    page.select_option("#sel-level", "all")
    _wait_view(page, "all levels · default", "values")
    fig = page.locator("figure[data-metric='loss']")
    assert fig.get_attribute("data-mini-count") == "3"
    assert fig.locator(".mini").evaluate_all("els => els.map(e => e.dataset.level)") == ["seeded", "strict", "none"]
    assert fig.locator(".mini canvas").count() >= 3
    boxes = fig.locator(".mini").evaluate_all("els => els.map(e => e.getBoundingClientRect().toJSON())")
    plots = fig.locator(".mini .uplot").evaluate_all("els => els.map(e => e.getBoundingClientRect().toJSON())")
    assert boxes[0]["top"] == boxes[2]["top"]  # side by side at 1280 px
    assert all(p["right"] <= b["right"] + 1 for p, b in zip(plots, boxes))  # no chart spills into its neighbour
    page.locator("figure[data-metric='loss']").scroll_into_view_if_needed()
    shot(page, "study-all-levels", full_page=False)

    page.set_viewport_size({"width": 420, "height": 900})
    page.wait_for_function("() => { const m = [...document.querySelectorAll('figure[data-metric] .mini')];"
                           " return m.length === 3 && m[1].getBoundingClientRect().top > m[0].getBoundingClientRect().bottom - 1; }")
    page.locator("figure[data-metric='loss']").scroll_into_view_if_needed()
    shot(page, "study-all-levels-phone", full_page=False)
    assert page.csp_violations == [] and page.console_errors == []
