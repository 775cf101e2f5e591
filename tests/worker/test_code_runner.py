"""User code resolved against an unpacked code copy: the entrypoint forms and command workloads."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from steady.worker.contract import codepack
from steady.worker.agent.local import run_local
from steady.worker.agent.runner import RunProcess

pytestmark = pytest.mark.slow

CODE = {
    "exp/as_main.py": """
        import sys
        from steady import sdk
        if __name__ == "__main__":
            sdk.log(step=0, loss=float(len(sys.argv)))
    """,
    "exp/fit.py": """
        def fit(ctx):
            ctx.log(step=0, loss=ctx.seed + 0.25)
    """,
    "mypkg/__init__.py": "",
    "mypkg/train.py": """
        import os
        def main(ctx):
            ctx.log(step=0, loss=float(os.path.exists("fit.py")))
    """,
    "exp/echo.py": """
        import json, os, sys
        from steady import sdk
        with open(os.path.join(sys.argv[-1], "argv.json"), "w") as f:
            json.dump(sys.argv[1:], f)
        sdk.log(step=0, loss=1.0)
    """,
    "exp/cmd.py": """
        import sys
        from steady import sdk
        seed, device, run_dir = sys.argv[1:4]
        sdk.log(step=0, loss=float(seed))
        if seed == "13":
            print("bad seed", file=sys.stderr)
            sys.exit(3)
    """,
}


def unpacked_code(files: dict[str, str], tmp_path) -> str:
    """``files`` (path -> source) written to a folder, packed as ``steady submit`` packs it and unpacked
    where a run's code goes: the code a run gets."""
    src = tmp_path / "src"
    for name, body in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(textwrap.dedent(body))
    dest = tmp_path / "run" / "code"
    codepack.extract(codepack.pack(str(src)).data, str(dest))
    return str(dest)


@pytest.fixture
def code(tmp_path):
    return unpacked_code(CODE, tmp_path)


def _run(code: str, tmp_path, **spec):
    # framework python: the code imports no framework, and under torch the run would import torch for nothing
    base = {"framework": "python", "seed": 7, "determinism": "seeded", "time_limit_s": 120, "code_workdir": "exp"}
    return run_local({**base, **spec}, code_dir=code, work_dir=str(tmp_path / "run"))


def test_entrypoint_forms_resolve_against_the_code(code, tmp_path):
    r = _run(code, tmp_path, entrypoint="as_main.py")  # no main(): runs as __main__
    assert r.ok, r.stderr_tail
    assert r.series["loss"] == ([0], [1.0])
    r = _run(code, tmp_path, entrypoint="fit.py:fit")
    assert r.ok and r.series["loss"] == ([0], [7.25]), r.stderr_tail
    r = _run(code, tmp_path, entrypoint="mypkg.train:main")  # a module from the code's top; cwd = exp/
    assert r.ok and r.series["loss"] == ([0], [1.0]), r.stderr_tail


def test_command_gets_placeholders_and_its_failure_is_reported(code, tmp_path):
    r = _run(code, tmp_path, command=["python", "cmd.py", "{seed}", "{device}", "{run_dir}"])
    assert r.ok, r.stderr_tail
    assert r.series["loss"] == ([0], [7.0]) and r.final_metrics == {"loss": 7.0}
    r = _run(code, tmp_path, seed=13, command=["python", "cmd.py", "{seed}", "{device}", "{run_dir}"])
    assert not r.ok and "exited with status 3" in r.error and "bad seed" in r.stderr_tail


ALL_PLACEHOLDERS = ["--seed={seed}", "{repeat}", "{determinism}", "{threads}", "{device}", "{checkpoint_dir}",
                    "{run_dir}"]


@pytest.mark.parametrize("python", ["python", "python3"])
def test_command_argv_fills_every_placeholder(tmp_path, python):
    spec = {"framework": "torch", "seed": 11, "repeat": 3, "determinism": "strict", "threads": 4,
            "command": [python, "train.py", *ALL_PLACEHOLDERS, "{{literal}}"]}
    proc = RunProcess(spec, run_dir=str(tmp_path / "r"), device="cpu", python="/opt/py/bin/python")
    assert proc.argv() == ["/opt/py/bin/python", "train.py", "--seed=11", "3", "strict", "4", "cpu",
                           str(tmp_path / "r" / "checkpoints"), str(tmp_path / "r"), "{literal}"]
    defaults = RunProcess({**spec, "repeat": None, "threads": None}, run_dir=str(tmp_path / "r"), device="cpu")
    assert defaults.argv()[3:6] == ["0", "strict", "2"]  # a spec without them: repeat 0, 2 threads


def test_command_receives_the_placeholders_of_its_run(code, tmp_path):
    spec = {"framework": "python", "seed": 5, "repeat": 2, "determinism": "none", "threads": 1, "time_limit_s": 120,
            "code_workdir": "exp", "command": ["python", "echo.py", *ALL_PLACEHOLDERS]}
    r = run_local(spec, code_dir=code, work_dir=str(tmp_path / "run"), device="cpu")
    assert r.ok, r.stderr_tail
    argv = json.loads((tmp_path / "run" / "argv.json").read_text())
    assert argv == ["--seed=5", "2", "none", "1", "cpu", str(tmp_path / "run" / "checkpoints"), str(tmp_path / "run")]
    assert os.path.isdir(argv[-2])  # made for the code to write its checkpoints into
