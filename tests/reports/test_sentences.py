"""No program values in the sentences a user reads: every view of a study (the terminal report, the
CI gate's Markdown and JUnit messages, the dashboard's study page) rendered over a range of studies,
read for ``None``, ``nan``/``inf`` as Python spells them and empty containers. The studies are
uploaded in process as external runs, so each view reads the report the server builds from stored runs."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from steady.server.cli.gate import gate_items, junit_xml, markdown
from steady.server.cli.render import render_report
from steady.server.reports.models import Report

pytestmark = pytest.mark.backends("sqlite")

# Python's spellings of a missing, non-finite or empty value, where a sentence has words
PROGRAM_VALUE = re.compile(
    r"\bNone\b(?! of\b)"  # "None of the seeds …" is English
    r"|(?<![\w.])-?(?:nan|inf)\b"
    r"|(?<![\w)\]])(?:\[\]|\{\}|\(\))"
    r"|\bset\(\)")


def program_values(text: str) -> list[str]:
    """The lines of ``text`` that hold a program value (empty: none)."""
    return [line.strip() for line in text.splitlines() if PROGRAM_VALUE.search(line)]


def test_the_reader_finds_what_it_looks_for():
    bad = ["within tolerance: by up to 0 from step None", "std nan over 3 seeds", "ratio -inf", "seeds: []",
           "details {}", "groups ()", "left: set()"]
    good = ["None of the 5 seeds diverged", "std 0.02 is 0.4× the limit", "info: infinite", "a[] b", "f() of x",
            "within tolerance: every logged value equal"]
    assert [program_values(t) for t in bad] == [[t] for t in bad]
    assert [program_values(t) for t in good] == [[] for _ in good]


class _Text(HTMLParser):
    """The text a reader sees on a page: no script, style or attribute values."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "template"):
            self._skip += 1
        elif tag in ("p", "div", "li", "tr", "br", "h1", "h2", "h3", "h4", "td", "th", "section", "summary"):
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style", "template") and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def page_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    return re.sub(r"[ \t]+", " ", "".join(parser.parts))


def junit_text(xml: bytes) -> str:
    """The messages a CI server shows from a JUnit file: each element's message and text."""
    return "\n".join(v for e in ET.fromstring(xml).iter() for v in (e.get("message"), e.text) if v and v.strip())


def _curve(seed: int, n: int = 40, *, offset: float = 0.0) -> list[float]:
    return [math.exp(-i / 15) + 0.01 * math.sin(seed + i / 5) + 0.003 * seed + offset for i in range(n)]


def _upload(api, sid: int, *, seed: int, repeat: int = 0, determinism: str = "seeded", stack: str = "cpu",
            values: list[float], final: str = "f", init: str | None = None, step_times: list[float] | None = None,
            metric: str = "loss") -> None:
    body = {"seed": seed, "repeat": repeat, "determinism": determinism, "stack": {"name": stack},
            "metrics": {metric: {"steps": list(range(len(values))), "values": values}},
            "digests": {"initial_weights": (init or chr(ord("a") + seed % 6)) * 64, "data_order": ["d" * 64],
                        "final_weights": final * 64}}
    if step_times is not None:
        body["step_times"] = step_times
    r = api.client.post(f"/api/v1/studies/{sid}/runs", content=json.dumps(body),
                        headers={**api.h(), "content-type": "application/json"})
    assert r.status_code == 201, r.text


def _study(api, name: str, metrics: list[dict], **spec) -> int:
    r = api.post("/api/v1/studies", json={"name": name, "kind": "external", "metrics": metrics, **spec})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _studies(api) -> dict[str, int]:
    """A range of studies, each a shape of evidence a sentence must put in words."""
    out = {}
    # repeats whose every value is equal while their final-weight digests differ (kernels moved a weight
    # below what the logged loss shows), at one seed: the demo's kernel study at --quick
    sid = out["equal values, differing digests"] = _study(api, "digests", [{"name": "loss"}])
    for det in ("seeded", "strict"):
        for rep in range(2):
            _upload(api, sid, seed=0, repeat=rep, determinism=det, values=_curve(0),
                    final="f" if det == "strict" or rep == 0 else "e")
    # five seeds, none varies from the first step, seeded identical; a limit the spread meets and one it does not
    sid = out["levels and limits"] = _study(api, "levels", [{"name": "loss", "max_std": 0.5}],
                                             cost_budget=1.5)
    for det in ("none", "seeded"):
        for seed in range(5):
            for rep in range(2):
                noise = 1e-4 * (rep + 1) if det == "none" else 0.0
                _upload(api, sid, seed=seed, repeat=rep, determinism=det, values=_curve(seed, offset=noise),
                        init=("xyz"[rep] if det == "none" else None), step_times=[0.1 + 0.001 * (seed % 3)] * 10)
    sid = out["unstable"] = _study(api, "unstable", [{"name": "loss", "max_std": 1e-4}])
    for seed in range(5):
        _upload(api, sid, seed=seed, values=_curve(seed, offset=0.05 * seed))
    # no limit, too few seeds, a diverged run, a single run per seed
    sid = out["no limit, a diverged seed"] = _study(api, "no limit", [{"name": "loss"}])
    for seed in range(3):
        values = _curve(seed)
        if seed == 2:
            values[20:] = [float("nan")] * 20
        _upload(api, sid, seed=seed, values=values)
    # every seed gives the same run: the seed has no effect
    sid = out["seed ignored"] = _study(api, "ignored", [{"name": "loss", "max_std": 0.1}])
    for seed in range(5):
        _upload(api, sid, seed=seed, values=_curve(0), init="a")
    # two stacks, with and without a margin
    sid = out["two stacks"] = _study(api, "stacks", [{"name": "loss", "margin": 0.05}, {"name": "acc"}])
    for stack, shift in (("cpu", 0.0), ("gpu", 0.001)):
        for seed in range(4):
            _upload(api, sid, seed=seed, stack=stack, values=_curve(seed, offset=shift))
            _upload(api, sid, seed=seed, repeat=1, stack=stack, values=_curve(seed, offset=shift), metric="acc")
    out["nothing yet"] = _study(api, "empty", [{"name": "loss", "max_std": 0.1}])
    return out


def _views(api, sid: int) -> tuple[Report, dict[str, str]]:
    r = api.get(f"/api/v1/studies/{sid}/report")
    assert r.status_code == 200, r.text
    report = Report.model_validate(r.json())
    page = api.client.get(f"/studies/{sid}")
    assert page.status_code == 200, page.text[:500]
    return report, {"terminal": render_report(report),
            "markdown": markdown(gate_items(report), title=report.study.name, link=f"http://x/studies/{sid}"),
            "junit": junit_text(junit_xml(gate_items(report), suite_name=report.study.name)),
            "dashboard": page_text(page.text)}


def test_no_view_of_any_study_holds_a_program_value(api):
    studies = _studies(api)
    r = api.client.post("/login", data={"token": api.tokens["user"]}, follow_redirects=False)
    assert r.status_code == 303, r.text
    found, seen = {}, set()
    for name, sid in studies.items():
        report, views = _views(api, sid)
        seen |= {f"{v.level}: {v.verdict}" for v in report.verdicts} | {f"outcome: {report.outcome.status}"}
        if name == "equal values, differing digests":  # the regression: "by up to 0 from step None"
            assert ("within tolerance: every logged value bitwise equal, but the final-weight or optimizer-state digests "
                    "differ") in views["terminal"], views["terminal"]
        for view, text in views.items():
            assert text.strip(), (name, view)
            if bad := program_values(text):
                found[f"{name} / {view}"] = bad
    assert not found, json.dumps(found, indent=1, ensure_ascii=False)
    # the range: every verdict a sentence is written for, and each outcome
    assert {"repeatability: identical", "repeatability: within_tolerance", "repeatability: out_of_tolerance",
            "repeatability: inconclusive", "seed_stability: stable", "seed_stability: unstable",
            "seed_stability: seed_has_no_effect", "seed_stability: inconclusive", "stack_portability: equivalent",
            "stack_portability: inconclusive", "outcome: pass", "outcome: fail", "outcome: inconclusive"} <= seen, seen
