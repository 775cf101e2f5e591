"""The calibration table as the docs print it: one Markdown row per scenario, every cell where GitHub puts it."""

from __future__ import annotations

import numpy as np
from markdown_it import MarkdownIt

from steady.server.stats.calibration import Rule, Scenario, measure
from steady.server.stats.calibration.table import format_markdown


def test_a_description_with_a_pipe_stays_in_its_cell():
    # "true |Δ| = margin" once split its row into 11 cells: GitHub dropped the last two and showed 'Δ' as k/n
    sc = Scenario("at-margin", "healthy", "3 seeds per stack, true |Δ| = margin = σ", lambda rng: rng.random() < 0.05)
    rule = Rule("stack_portability:equivalent", 0.05, "false 'equivalent' ≤ 5% | Holm", (sc,))
    r = measure(rule, sc, n=40, rng=np.random.default_rng(0))
    html = MarkdownIt("commonmark").enable("table").render(format_markdown([(rule, sc.description, r)]))
    body = html.split("<tbody>")[1]
    cells = [c.split("</td>")[0] for c in body.split("<td>")[1:]]
    assert len(cells) == 9, cells
    assert cells[3] == "3 seeds per stack, true |Δ| = margin = σ"
    assert cells[4] == f"{r.k}/40" and cells[8] == "false 'equivalent' ≤ 5% | Holm"
