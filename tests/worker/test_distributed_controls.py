"""``steady demo --controls --distributed``: the controls cover every planted setting at 3 or 4 ranks (never 2,
where a + b == b + a hides the reduction order), the command tabulates them, and the smallest set of real runs
that shows the two findings: a varied reduction order and a per-rank PYTHONHASHSEED, each named ``distributed``
for its own reason. The full 5-seed table is the demo's (docs/controls.md)."""

from __future__ import annotations

import pytest

from steady.server.cli import build_parser
from steady.server.cli.demo import distributed_controls as demo


def test_the_controls_cover_each_plant_at_three_or_more_ranks_and_the_command_tabulates_them(monkeypatch, capsys):
    by_plant = {}
    for c in demo.CONTROLS:
        by_plant.setdefault(c.plant, []).append(c)
        assert min(c.world_sizes or (c.nproc,)) >= 3, c
    assert {c.nproc for c in by_plant["reduction_order"]} == {3, 4}
    assert {(c.nproc, c.reduce) for c in by_plant["none"] if not c.world_sizes} == {(3, "ddp"), (4, "ddp"), (3, "manual")}
    assert [c.expected for c in by_plant["bucket"] + by_plant["hashseed"]] == ["distributed"] * 2
    assert [c.expected for c in by_plant["sampler"]] == ["data_order"]
    assert [(c.world_sizes, c.expected) for c in demo.CONTROLS if c.world_sizes] == [((3, 4), "stack")]
    seen = {}

    def fake(controls=demo.CONTROLS, *, seeds, steps=12, progress=None):
        seen["seeds"], seen["names"] = list(seeds), [c.name for c in controls]
        rows = [demo.DistRow(c.name, str(c.nproc), c.expected, len(seeds), len(seeds), (c.expected or "—",),
                             ("identical",) if c.expected is None else ("out_of_tolerance",), None, "why", 1.0)
                for c in controls]
        for row in rows:
            progress(row)
        return rows

    monkeypatch.setattr(demo, "run_controls", fake)
    args = build_parser().parse_args(["demo", "--controls", "--distributed", "--seeds", "2", "--only", "bucket"])
    assert args.func(args) == 0 and seen["seeds"] == [0, 1] and seen["names"] == ["DDP bucket_cap_mb 0.004 vs 0.006"]
    out = capsys.readouterr().out
    assert "| DDP bucket_cap_mb 0.004 vs 0.006 | 3 " in out and "2 of 2" in out
    assert "1 of 1 controls judged as required" in out


@pytest.mark.slow
def test_a_varied_reduction_order_and_a_per_rank_hashseed_are_named_each_for_its_reason():
    controls = [c for c in demo.CONTROLS if c.plant in ("reduction_order", "hashseed") and c.nproc == 3]
    rows = demo.run_controls(controls, seeds=[0], steps=6)
    order, hashseed = rows
    assert order.ok and order.named == ("distributed",) and "reduction: at update " in order.reason, order
    assert hashseed.ok and hashseed.named == ("distributed",) and "registers its parameters in another order" in hashseed.reason, hashseed
