"""The skip policy (tests/skip_policy.py) on a throwaway suite, in a pytest of its own: a skip for a tool the
README's setup installs fails the run where CI is set, with and without parallel workers, and stays a skip
(exit 0) where it is not; a skip CI accepts never fails it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SUITE = {
    "test_tools.py": "import pytest\n\n"
                     "def test_runs():\n    pass\n\n"
                     "def test_needs_nginx():\n    pytest.skip('nginx is not installed (make system-deps installs it)')\n\n"
                     "def test_needs_root():\n    pytest.skip('--run-as needs root (useradd, setuid)')\n",
    "test_module_skipped.py": "import pytest\n\npytest.importorskip('steady_no_such_module')\n\n"
                              "def test_never_collected():\n    pass\n",
}


def _pytest(tmp_path: Path, ci: str | None, *args: str, files=tuple(SUITE)) -> subprocess.CompletedProcess:
    for name in files:
        (tmp_path / name).write_text(SUITE[name])
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    env.update(PYTHONPATH=str(REPO), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", **({"CI": ci} if ci is not None else {}))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "-p", "tests.skip_policy", *args, *files], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ci", [None, "false"])
def test_without_ci_a_skip_stays_a_skip(tmp_path, ci):
    r = _pytest(tmp_path, ci)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 3 skipped" in r.stdout and "skips that fail in CI" not in r.stdout, r.stdout


@pytest.mark.parametrize("workers", [(), ("-p", "xdist", "-n", "2")], ids=["in-process", "xdist"])
def test_in_ci_a_skip_for_a_tool_the_setup_installs_fails_the_run(tmp_path, workers):
    r = _pytest(tmp_path, "true", *workers)
    assert r.returncode == 1, r.stdout + r.stderr
    summary = r.stdout.split("skips that fail in CI", 1)[1].split("short test summary info", 1)[0]
    assert "test_tools.py::test_needs_nginx: nginx is not installed" in summary, r.stdout
    assert "test_module_skipped.py: could not import 'steady_no_such_module'" in summary, r.stdout
    assert "needs root" not in summary  # root is not something the setup installs
    assert "what these 2 tests need: the run fails" in summary


def test_in_ci_a_skip_ci_accepts_does_not_fail_the_run(tmp_path):
    (tmp_path / "test_root.py").write_text("import pytest\n\ndef test_needs_root():\n"
                                           "    pytest.skip('--run-as needs root')\n")
    r = _pytest(tmp_path, "true", "test_root.py", files=())
    assert r.returncode == 0 and "1 skipped" in r.stdout and "skips that fail in CI" not in r.stdout, r.stdout
