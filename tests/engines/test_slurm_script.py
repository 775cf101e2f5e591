"""The batch script ``steady launch slurm`` submits (no cluster needed)."""

from __future__ import annotations

import subprocess

import pytest

from steady.server.cli import main
from steady.server.engines.slurm import LaunchError, SlurmLaunch, batch_script


def test_dry_run_prints_a_job_array_of_agents(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("STEADY_WORKER_TOKEN", "stdy_secret_worker_token")
    rc = main(["launch", "slurm", "42", "--server", "http://steady:8080", "--tasks", "8", "--gpus-per-task", "1",
               "--partition", "gpu", "--time", "4:00:00", "--mem", "32G", "--output-dir", str(tmp_path),
               "--sbatch-option=--qos=high", "--worker-arg=--labels=a100", "--agent-command", "/opt/steady/bin/steady worker",
               "--dry-run"])
    script = capsys.readouterr().out
    assert rc == 0
    for line in ("#SBATCH --array=0-7", "#SBATCH --gpus-per-task=1", "#SBATCH --partition=gpu",
                 "#SBATCH --time=4:00:00", "#SBATCH --mem=32G", "#SBATCH --qos=high",
                 f"#SBATCH --output={tmp_path}/steady-slurm-%A_%a.out", "export STEADY_SERVER=http://steady:8080"):
        assert line in script.splitlines(), line
    assert ("exec /opt/steady/bin/steady worker --study 42 --exit-when-idle --grace 20 --labels=a100 "
            '--name "steady-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"') in script
    assert "stdy_secret_worker_token" not in script  # the token travels in the environment of sbatch
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_cpu_only_tasks_ask_for_no_gpu():
    script = batch_script(SlurmLaunch(study_id=1, server="http://s", tasks=2, gpus_per_task=0))
    assert "--gpus-per-task" not in script and "#SBATCH --array=0-1" in script


@pytest.mark.parametrize("bad", [{"tasks": 0}, {"time": "four hours"}, {"partition": "gpu; rm -rf /"},
                                 {"gpus_per_task": -1}, {"grace_s": -1}])
def test_bad_options_are_refused(bad):
    with pytest.raises(LaunchError):
        SlurmLaunch(**{"study_id": 1, "server": "http://s", "tasks": 2, **bad})


def test_submit_without_sbatch_says_so(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("steady.server.cli.client.Api.get", lambda self, path, **kw: {"id": 1, "name": "s"})
    rc = main(["launch", "slurm", "1", "--tasks", "2", "--worker-token", "t", "--output-dir", str(tmp_path)])
    assert rc == 1 and "sbatch not found" in capsys.readouterr().err


def test_a_newline_in_the_working_directory_never_reaches_the_script(tmp_path, monkeypatch):
    """The check ran on the typed --output-dir; the script gets it resolved, so "." in a directory whose
    name holds a newline wrote a line of its own into the batch script (run on every node)."""
    cwd = tmp_path / "x\ntouch owned"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with pytest.raises(LaunchError, match="resolved"):
        SlurmLaunch(study_id=1, server="http://s", tasks=2, output_dir=".")
