"""Skips in CI: `make test` prints every skip's reason (``-rfEs``), and where ``CI`` is true a skip fails the
run unless its reason is in ``ALLOWED_IN_CI``.

The README's setup (``make setup``) installs everything else a skip here can name: Chromium, docker-compose,
Slurm and munge, nginx and npm (Debian packages), PyTorch and TensorFlow, and the server, workload and test
extras (statsmodels, Kubernetes' client and validator, e3nn, PyTorch Geometric, MLflow's client, tqdm,
scikit-learn). So in CI such a skip is a broken setup that would hide the real-cluster, proxy or browser tests,
not a test to leave out. Locally (``CI`` unset) a skip stays a skip.

``tests/conftest.py`` imports the hooks; ``tests/test_skip_policy.py`` runs them on a throwaway suite.
"""
from __future__ import annotations

import os

import pytest

# (a phrase of the skip's reason, why the setup cannot provide it)
ALLOWED_IN_CI: tuple[tuple[str, str], ...] = (
    ("--run-as needs root", "root is a privilege of the machine CI runs on, not something the setup installs"),
    ("openssl is not installed", "the setup does not install openssl (Debian's base images carry it)"),
)

_found: list[tuple[str, str]] = []


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _reason(report) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def _record(report) -> None:
    if not (report.skipped and in_ci()) or hasattr(report, "wasxfail"):
        return
    reason = _reason(report)
    if not any(phrase in reason for phrase, _ in ALLOWED_IN_CI):
        _found.append((report.nodeid, reason))


def pytest_runtest_logreport(report) -> None:
    _record(report)


def pytest_collectreport(report) -> None:  # a module skipped as a whole (importorskip at module level)
    _record(report)


def _controller(config) -> bool:
    return not hasattr(config, "workerinput")  # xdist: the workers' reports reach the controller too


def pytest_sessionfinish(session, exitstatus) -> None:
    if _found and _controller(session.config) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not (_found and _controller(config)):
        return
    terminalreporter.section("skips that fail in CI", sep="=", red=True, bold=True)
    for nodeid, reason in _found:
        terminalreporter.line(f"SKIPPED {nodeid}: {reason}")
    what = "this test needs" if len(_found) == 1 else f"these {len(_found)} tests need"
    terminalreporter.line(f"CI is set, and the README's setup installs what {what}: the run fails "
                          "(tests/skip_policy.py lists the skips CI accepts)", red=True)
