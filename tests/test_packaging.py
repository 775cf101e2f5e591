"""One installed name: the wheel holds the package ``steady`` and nothing else at its top level, and a
user's own ``app`` package and ``worker.py`` are the ones a run imports."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile

import pytest

from steady.worker.agent.local import run_local
from tests.conftest import REPO
from tests.worker.test_code_runner import unpacked_code


def test_the_wheel_installs_one_top_level_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path), str(REPO)], check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("steady-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"steady"}, top
    for inside in ("steady/server/web/main.py", "steady/worker/inrun/sdk.py", "steady/worker/inrun/shim/sitecustomize.py",
                   "steady/server/dashboard/templates/base.html", "steady/migrations/env.py",
                   # the browser assets scripts/fetch-assets puts in place (not in the repository)
                   "steady/server/dashboard/static/uplot.iife.min.js", "steady/server/dashboard/static/uplot.min.css",
                   "steady/server/dashboard/static/uplot.LICENSE",
                   "steady/server/dashboard/static/apidocs/swagger-ui-bundle.js",
                   "steady/server/dashboard/static/apidocs/swagger-ui.css",
                   "steady/server/dashboard/static/apidocs/redoc.standalone.js"):
        assert inside in names, inside
    assert any(n.startswith("steady/migrations/versions/") for n in names)
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "steady = steady.server.cli:main" in entry


def test_no_code_imports_a_generic_top_level_name():
    # Everything is spelled steady.server / steady.worker: no second import path to the same module.
    offenders = []
    for folder in ("app", "worker", "tests", "migrations", "scripts", "bench", "examples"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if "fixtures" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
                if isinstance(node, (ast.List, ast.Tuple)):  # an argv such as [sys.executable, "-m", "worker"]
                    words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
                    names += [m for flag, m in zip(words, words[1:]) if flag == "-m" and isinstance(m, str)]
                if isinstance(node, ast.Constant) and isinstance(node.value, str):  # "python -m worker ..."
                    names += re.findall(r"-m\s+([\w.]+)", node.value)
                offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in ("app", "worker")]
    assert not offenders, offenders


USER_PROJECT = {
    # a FastAPI-style project: its own `app` package and a `worker.py` beside the training script
    "app/__init__.py": "",
    "app/model.py": "SCALE = 0.5\n",
    "worker.py": "def batches(seed):\n    return [seed * 0.25, 1.0]\n",
    "train.py": """
        import os, sys
        import app.model
        import worker
        from steady import sdk

        here = os.getcwd()
        mine = all(m.__file__.startswith(here) for m in (app.model, worker))
        seed = int(sys.argv[sys.argv.index("--seed") + 1])
        for step, b in enumerate(worker.batches(seed)):
            sdk.log(step=step, loss=b * app.model.SCALE, own_modules=float(mine))
    """,
}


@pytest.mark.slow
def test_a_user_project_with_its_own_app_and_worker_runs_as_a_command(tmp_path):
    code = unpacked_code(USER_PROJECT, tmp_path)
    spec = {"framework": "torch", "seed": 4, "repeat": 0, "determinism": "seeded",
            "command": ["python", "train.py", "--seed", "{seed}"]}
    r = run_local(spec, code_dir=code, work_dir=str(tmp_path / "run"))
    assert r.ok, r.error + r.stderr_tail
    assert r.values("own_modules") == [1.0, 1.0]
    assert r.values("loss") == [0.5, 0.5]  # 4 * 0.25 * 0.5, then 1.0 * 0.5: the user's app.model and worker
