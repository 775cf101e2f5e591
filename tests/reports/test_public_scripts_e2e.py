"""A public-example-style script as a new user runs it, unmodified: it prints its loss with two decimals and
its own ms/batch, steps its weights by hand (``p.data.add_``, no ``torch.optim``) and seeds itself from
``--seed {seed}``. Submitted from a fresh git folder at ``none`` and ``seeded``, its report says exactly what
was compared and at which resolution ("equal at the 2 printed decimals", the weights bitwise through their
digests, found without an optimizer), the variance by source agrees with the repeats (all of it between
seeds), and the cost comes from the printed ms/batch with its interval. A copy keeping its weights in plain
tensors gets no digest, and the report says which and why. A real ``steady serve`` and a real worker."""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.reports.test_user_scripts_e2e import _gates
from tests.worker.test_worker_agent_e2e import Worker

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parents[1] / "worker" / "fixtures" / "torch_hand_update.py"
SPEC = """
    name: {name}
    workload:
      framework: torch
      command: ["python", "train.py", "--seed", "{{seed}}"{extra}]
      capture:
        patterns: ['step +(?P<step>\\d+) \\| ms/batch +(?P<step_time>[0-9.]+) \\| loss +(?P<loss>[0-9.]+)']
    seeds: [{seeds}]
    repeats: 2
    determinism: [{levels}]
    threads: 1
    max_attempts: 1
    metrics: [{{name: loss, max_std: 10.0}}]
"""
PROGRAM_VALUES = re.compile(r"\b(None|nan|NaN)\b|\[\]")


def _project(root: Path, *, name: str, seeds: str, levels: str, bare: bool) -> Path:
    root.mkdir()
    shutil.copy(SCRIPT, root / "train.py")
    (root / "study.yaml").write_text(textwrap.dedent(SPEC.format(
        name=name, seeds=seeds, levels=levels, extra=', "--bare"' if bare else "")).lstrip())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "the example"], cwd=root, check=True)
    return root


def test_a_public_style_script_is_judged_at_its_printed_resolution(live_server, tmp_path):
    module = _project(tmp_path / "example", name="public-example", seeds="1, 2", levels="none, seeded", bare=False)
    bare = _project(tmp_path / "bare", name="public-example-bare", seeds="1", levels="seeded", bare=True)
    (tmp_path / "worker-home").mkdir()
    worker = Worker(live_server, tmp_path, "public", "--concurrency", "2", cwd=tmp_path / "worker-home")
    try:
        ok = _gates(live_server, module)
        plain = _gates(live_server, bare)
    finally:
        worker.stop()

    rep, text = ok["body"], ok["report"].stdout
    assert rep.study.progress.completed == 8, worker.log()
    rows = {v.group.determinism: v for v in rep.of_level("repeatability")}
    assert {d: v.verdict for d, v in rows.items()} == {"none": "identical", "seeded": "identical"}
    for v in rows.values():
        # text at two decimals: never "bitwise" for the values; the weights bitwise through their digests
        assert v.summary.startswith("identical: every repeat equal at the 2 printed decimals, weights bitwise "
                                    "equal (digests)"), v.summary
        assert "equal at the 2 printed decimals (values parsed from text" in v.reason, v.reason
        assert "the weights bitwise equal (initial-weight and final-weight digests)" in v.reason, v.reason
        assert "bitwise identical" not in v.reason
        assert v.guarantee.startswith("exact at the printed precision only") and "(0.01)" in v.guarantee
        c = v.compared
        assert c is not None and (c.basis, c.decimals, c.resolution) == ("printed", 2, 0.01)
        assert {"initial_weights", "final_weights"} <= set(c.digests) and c.missing == {}
    assert "identical: every repeat equal at the 2 printed decimals" in text
    # one evidence model: repeats identical within each seed at none, so the variance is between seeds
    none = next(e for e in rep.variance_by_source if e.group.determinism == "none")
    assert none.between_seed_applies is True and none.components.within == 0.0
    assert "run to run" not in text and "not applied" not in text and "ignores" not in text
    # the cost from the printed ms/batch, said with its interval
    cost = [c for c in rep.determinism_cost if (c.numerator, c.denominator) == ("seeded", "none")]
    assert cost and cost[0].source == "step_time" and "95% CI" in cost[0].summary, rep.determinism_cost
    assert f"seeded / none (default): {cost[0].summary}" in text or cost[0].summary in text
    for line in text.splitlines():
        assert not PROGRAM_VALUES.search(line), line
    with live_server.client() as c:  # the badge's tooltip names the resolution too
        got = c.get("/dashboard/data/badges", params={"ids": str(rep.study.id)}).json()["badges"][str(rep.study.id)]
    (badge,) = [b for b in got if b["level"] == "repeatability"]
    assert "values compared at the 2 printed decimals" in badge["hint"], badge

    # weights in plain tensors: no digest, and the report says which and why
    rep = plain["body"]
    (v,) = rep.of_level("repeatability")
    assert v.verdict == "identical", v
    assert v.summary.startswith("identical: every repeat equal at the 2 printed decimals (no weight digest: no "
                                "torch.optim optimizer stepped and no torch.nn.Module"), v.summary
    assert "no initial-weight and final-weight digests: no torch.optim optimizer stepped" in v.reason, v.reason
    assert "bitwise" not in v.summary + v.reason
    assert "no weight digest: no torch.optim optimizer stepped" in plain["report"].stdout
