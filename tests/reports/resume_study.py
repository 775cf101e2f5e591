"""A user's resume study end to end, as the resume e2e tests share it: their project (script and study file)
in a fresh git folder, a real worker on the shared ``steady serve``, ``steady submit --wait``, and the study's
report as text and as JSON."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import run_cli_in_process, user_project
from tests.worker.test_worker_agent_e2e import Worker
from tests.gitfolder import user_env


@dataclass
class ResumeStudy:
    folder: Path  # the user's project, the working folder of every command
    env: dict[str, str]  # the user's environment (server, token, no colour, a home of their own)
    worker: Worker  # stopped; its log explains a failure
    submit: Any  # `steady submit study.yaml --wait`
    sid: str
    report: Any  # `steady report <sid>`
    body: Any  # the report as the typed model (`steady report <sid> --json`)

    def cli(self, *args: str) -> Any:
        """A further ``steady`` command as the user runs it."""
        return run_cli_in_process(*args, env=self.env, cwd=self.folder)


def run_resume_study(live_server, tmp_path: Path, files: dict[str, str], worker_name: str) -> ResumeStudy:
    """Publish ``files`` (``train.py`` and ``study.yaml``) as the user's project, submit the study with one
    worker running it, and read its report."""
    folder = user_project(tmp_path / "project", files)
    (tmp_path / "worker-home").mkdir()
    env = user_env(live_server, folder)
    worker = Worker(live_server, tmp_path, worker_name, "--concurrency", "1", cwd=tmp_path / "worker-home")
    try:
        submit = run_cli_in_process("submit", "study.yaml", "--wait", env=env, cwd=folder)
    finally:
        worker.stop()
    found = re.search(r"submitted study (\d+)", submit.stdout + submit.stderr)
    assert found, (submit.stdout, submit.stderr)
    sid = found.group(1)
    report = run_cli_in_process("report", sid, env=env, cwd=folder)
    from steady.server.reports.models import Report

    body = Report.model_validate_json(run_cli_in_process("report", sid, "--json", env=env, cwd=folder).stdout)
    return ResumeStudy(folder, env, worker, submit, sid, report, body)
