"""The CLI's code shipping refuses an arm's code it cannot ship before it contacts the server (the
server named here does not exist): a label that is no folder, a folder under --no-code, a folder
without the workload's script. Shipping that works: tests/worker/test_arm_code_e2e.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from steady.server.cli import build_parser, main
from steady.server.cli.support import EXIT_CANNOT_JUDGE

NOWHERE = ["--server", "http://127.0.0.1:9", "--token", "stdy_unused"]


def _spec(folder: Path, arm_b: str) -> Path:
    (folder / "arm_a").mkdir(parents=True)
    (folder / "arm_a" / "train.py").write_text("print('a')\n")
    (folder / "arm_b").mkdir()
    (folder / "arm_b" / "evaluate.py").write_text("print('b')\n")
    spec = folder / "spec.yaml"
    spec.write_text(textwrap.dedent(f"""
        name: arms
        workload: {{framework: torch, command: [python, train.py]}}
        seeds: [0]
        arms:
          - {{name: a, code: arm_a}}
          - {{name: b, code: {arm_b}}}
    """))
    return spec


@pytest.mark.parametrize("command", ["submit", "check"])
@pytest.mark.parametrize(
    ("arm_b", "extra", "needle"),
    [
        ('"git:3f2a1c0"', [], "arms[1].code 'git:3f2a1c0' (arm 'b'): not a folder"),
        ("arm_b", [], "arms[1].code (arm 'b'): command script train.py is not in the code packed from"),
        ("arm_a", ["--no-code"], "arms[0].code (arm 'a') is the folder 'arm_a', but --no-code ships nothing"),
    ],
)
def test_an_arm_code_that_cannot_be_shipped_is_refused_before_the_server(tmp_path, capsys, command, arm_b, extra, needle):
    spec = _spec(tmp_path, arm_b)
    # both gates: "could not judge" (3), never mistaken for an inconclusive verdict (2)
    assert main([command, str(spec), *NOWHERE, *extra]) == EXIT_CANNOT_JUDGE
    assert needle in capsys.readouterr().err


def test_check_takes_the_code_options_of_submit():
    args = build_parser().parse_args(["check", "spec.yaml", "--code", "src", "--max-code-mb", "5", "--no-code"])
    assert (args.code, args.max_code_mb, args.no_code) == ("src", 5.0, True)


@pytest.mark.parametrize("command", ["submit", "check"])
def test_code_dir_is_refused_when_every_arm_runs_its_own(tmp_path, capsys, command):
    spec = _spec(tmp_path, "arm_a")
    code = EXIT_CANNOT_JUDGE  # submit and check are gates alike
    assert main([command, str(spec), *NOWHERE, "--code", str(tmp_path / "arm_a")]) == code
    assert "every arm names its own code, so no run would execute it" in capsys.readouterr().err
