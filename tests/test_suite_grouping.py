"""The suite's own machinery: tests marked ``xdist_group`` run on one xdist worker under ``make test``'s
``--dist loadgroup`` (the ``--run-as`` tests rely on it: each grants o+x on the interpreter's folders and
takes it back when it ends). pytest 9.2 silently broke this (pytest-xdist #1386): the marks stayed, the
grouping went, and two such tests ran side by side."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap


def test_an_xdist_group_runs_on_one_worker(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_grouped.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.xdist_group("together")
        def test_first(): pass

        @pytest.mark.xdist_group("together")
        def test_second(): pass

        def test_free_1(): pass

        def test_free_2(): pass
    """))
    out = subprocess.run([sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
                          "test_grouped.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    on = {name: gw for gw, name in re.findall(r"\[(gw\d+)\] .*PASSED test_grouped\.py::(test_\w+)", out.stdout)}
    assert set(on) == {"test_first", "test_second", "test_free_1", "test_free_2"}, out.stdout
    assert on["test_first"] == on["test_second"], out.stdout
