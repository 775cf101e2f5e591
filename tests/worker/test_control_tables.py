"""The control drivers' tables (``steady demo --controls``, ``--resume``, ``--distributed``): one Markdown printer,
columns padded to their widest cell. No training here: rows made by hand."""

from __future__ import annotations

from steady.server.cli.demo.controls import markdown_table
from steady.server.cli.demo.distributed_controls import DistRow
from steady.server.cli.demo.distributed_controls import format_table as distributed_table
from steady.server.cli.demo.resume_controls import ResumeRow
from steady.server.cli.demo.resume_controls import format_table as resume_table


def test_columns_are_padded_to_their_widest_cell_under_a_rule():
    assert markdown_table(("a", "bbb"), [("xxxx", "y")]) == "| a    | bbb |\n|------|-----|\n| xxxx | y   |"
    assert markdown_table(("a", "b"), []) == "| a | b |\n|---|---|"


def test_the_resume_and_distributed_drivers_print_through_it():
    rows = [ResumeRow("omit rng", "torch_rng", (3,), 5, 4, ("torch_rng",), 1.0),
            ResumeRow("ref", None, (2, 4), 5, 5, (), 1.0, micro_batches=2)]
    assert resume_table(rows).splitlines() == [
        "| omitted on resume | resumed after update | must be named       | judged as required | named     |",
        "|-------------------|----------------------|---------------------|--------------------|-----------|",
        "| omit rng          | 3                    | torch_rng           | 4 of 5             | torch_rng |",
        "| ref               | 2, 4 + 2 micro-batch | nothing (identical) | 5 of 5             | —         |",
    ]
    dist = [DistRow("reference", "3/4", None, 5, 4, (), ("identical", "identical"), None, "r", 1.0)]
    assert distributed_table(dist).splitlines()[2] == (
        "| reference | 3/4   | nothing (identical) | 4 of 5             | identical, identical |       |")
