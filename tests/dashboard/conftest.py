"""Browser fixtures: headless Chromium (the system build) driven by Playwright's sync API."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

CHROMIUM = os.environ.get("STEADY_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def new_page(browser):
    """factory(server, logged_in=True) -> a page in a fresh 1280×720 context; dialogs are recorded."""
    contexts = []

    def _new(server, *, logged_in: bool = True):
        context = browser.new_context(viewport={"width": 1280, "height": 720})
        if logged_in:
            # a real session from a login: the cookie holds a session id, never the token
            import httpx

            r = httpx.post(server.url + "/login", data={"token": server.tokens["user"]})
            sid = r.history[0].cookies["steady_session"] if r.history else r.cookies["steady_session"]
            context.add_cookies([{"name": "steady_session", "value": sid, "url": server.url,
                                  "httpOnly": True, "sameSite": "Lax"}])
        contexts.append(context)
        page = context.new_page()
        page.dialogs = []
        page.console_errors = []
        page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
        page.on("pageerror", lambda e: page.console_errors.append(str(e)))
        page.csp_violations = []  # what the Content-Security-Policy refused (a console error each)
        page.on("console", lambda m: m.type == "error" and "Content Security Policy" in m.text
                and page.csp_violations.append(m.text))
        page.set_default_timeout(15_000)
        return page

    yield _new
    for c in contexts:
        c.close()


def shot(page, name: str, full_page: bool = True) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    # a full-page capture of a long page (ReDoc) rasterises for seconds on a loaded 2-core machine; the
    # picture is not the property under test, so it gets more room than a page's own waits
    page.screenshot(path=str(path), full_page=full_page, timeout=90_000)
    return path


def upload_external(client: httpx.Client, study_id: int, *, seed: int, repeat: int = 0, determinism: str = "seeded",
                    stack: str = "default", values: list[float], step_times: list[float] | None = None,
                    digest: str = "a", dtype: str | None = None) -> dict:
    body = {
        "seed": seed, "repeat": repeat, "determinism": determinism, "stack": {"name": stack},
        "metrics": {"loss": {"steps": list(range(len(values))), "values": values}},
        "digests": {"initial_weights": digest * 64, "data_order": ["d" * 64], "final_weights": "f" * 64},
    }
    if step_times is not None:
        body["step_times"] = step_times
    if dtype is not None:
        body["metrics"]["loss"]["dtype"] = dtype
    # json.dumps writes NaN literals, which the API accepts for diverged runs
    r = client.post(f"/api/v1/studies/{study_id}/runs", content=json.dumps(body),
                    headers={"content-type": "application/json"})
    assert r.status_code == 201, r.text
    return r.json()


def curve(seed: int, n: int = 400, *, scale: float = 0.01, offset: float = 0.0) -> list[float]:
    """A decaying loss curve; the seed moves it a little."""
    return [math.exp(-i / 120) + scale * math.sin(seed + i / 30) + offset + 0.002 * seed for i in range(n)]
